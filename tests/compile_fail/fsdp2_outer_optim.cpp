// expect: tessera: fsdp2 keeps whole rows per rank, which outer<optim> would cut
#include "tessera/wrapper/data_parallel.hpp"
using Cfg = tessera::config<tessera::optim_grads_params, tessera::fsdp2, tessera::outer<tessera::optim>>;
static_assert(sizeof(Cfg) > 0);
