// expect: tessera: the argument is not a tessera communicator
#include "tessera/backend/host/ops.hpp"
#include "tessera/wrapper/data_parallel.hpp"
struct not_comm { using backend_type = tessera::backend::host; };
void f() {
  not_comm c;
  tessera::FullyShardedDataParallel<tessera::config<tessera::optim>> model(c);
}
