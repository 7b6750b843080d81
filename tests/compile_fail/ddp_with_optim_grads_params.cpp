// expect: tessera: DistributedDataParallel keeps replicated compute weights and cannot shard parameters
#include "tessera/wrapper/data_parallel.hpp"
using Cfg = tessera::config<tessera::optim_grads_params, tessera::ddp>;
tessera::data_parallel_t<Cfg>* p = nullptr;
static_assert(sizeof(Cfg) > 0);
