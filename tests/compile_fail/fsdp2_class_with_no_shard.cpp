// expect: tessera: FullyShardedDataParallel2 (fsdp2) runs optim_grads_params only
#include "tessera/wrapper/data_parallel.hpp"
// The class named directly, with a config of another wrapper, is refused too.
using Cfg = tessera::config<tessera::no_shard, tessera::fsdp>;
template class tessera::FullyShardedDataParallel2<Cfg>;
