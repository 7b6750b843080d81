// expect: tessera: the outer policy (across replica groups) is outer<no_shard> (HSDP: replicate) or
#include "tessera/wrapper/data_parallel.hpp"
using Cfg = tessera::config<tessera::optim_grads_params, tessera::fsdp, tessera::outer<tessera::optim_grads>>;
static_assert(sizeof(Cfg) > 0);
