// expect: tessera: outer<optim> (HFSDP) splits the gradient shard of a sharded-gradient strategy again
#include "tessera/wrapper/data_parallel.hpp"
using Cfg = tessera::config<tessera::optim, tessera::fsdp, tessera::outer<tessera::optim>>;
static_assert(sizeof(Cfg) > 0);
