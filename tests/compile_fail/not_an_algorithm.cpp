// expect: tessera: ShardedOptimizer's first argument is not a tessera optimizer algorithm
#include "tessera/optim/sharded_optimizer.hpp"
struct adam_without_kernel {
  using tessera_algorithm = void;
  static constexpr int state_count = 2;
  double lr = 1e-3;
};
void f(tessera::data_parallel_t<tessera::config<tessera::optim>>& m) {
  tessera::ShardedOptimizer<adam_without_kernel, tessera::data_parallel_t<tessera::config<tessera::optim>>> o(m, {});
}
