// expect: tessera: config was given two policies of one kind
#include "tessera/wrapper/data_parallel.hpp"
using Cfg = tessera::config<tessera::optim_grads_params, tessera::fsdp, tessera::outer<tessera::optim>,
                            tessera::outer<tessera::no_shard>>;
static_assert(sizeof(Cfg) > 0);
