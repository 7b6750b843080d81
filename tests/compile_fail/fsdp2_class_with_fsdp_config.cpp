// expect: tessera: FullyShardedDataParallel2 needs a config whose wrapper is fsdp2
#include "tessera/wrapper/data_parallel.hpp"
using Cfg = tessera::config<tessera::optim_grads_params, tessera::fsdp>;
template class tessera::FullyShardedDataParallel2<Cfg>;
