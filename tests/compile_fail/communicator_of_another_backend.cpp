// expect: tessera: the communicator belongs to another backend than the config
#include <cstddef>

#include "tessera/backend/host/ops.hpp"
#include "tessera/wrapper/data_parallel.hpp"

// Satisfies the communicator concept, but for device memory.
struct device_comm {
  using backend_type = tessera::backend::cuda;
  int rank() const { return 0; }
  int size() const { return 1; }
  void all_gather(const void*, void*, std::size_t, tessera::dtype) {}
  void reduce_scatter(const void*, void*, std::size_t, tessera::dtype, tessera::comm::reduce_op) {}
  void all_reduce(const void*, void*, std::size_t, tessera::dtype, tessera::comm::reduce_op) {}
  void broadcast(void*, std::size_t, tessera::dtype, int) {}
  void barrier() {}
  tessera::comm::request iall_gather(const void*, void*, std::size_t, tessera::dtype) { return {}; }
  tessera::comm::request ireduce_scatter(const void*, void*, std::size_t, tessera::dtype, tessera::comm::reduce_op) { return {}; }
  tessera::comm::request iall_reduce(const void*, void*, std::size_t, tessera::dtype, tessera::comm::reduce_op) { return {}; }
};
static_assert(tessera::comm::communicator<device_comm>);

void f() {
  device_comm c;
  tessera::FullyShardedDataParallel<tessera::config<tessera::optim>> model(c);
}
