// expect: tessera: DistributedDataParallel keeps replicated compute weights and cannot shard parameters; use FullyShardedDataParallel
#include "tessera/wrapper/data_parallel.hpp"
using Cfg = tessera::config<tessera::optim_grads_params, tessera::fsdp>;
static_assert(sizeof(tessera::DistributedDataParallel<Cfg>) > 0);
