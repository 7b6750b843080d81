// expect: tessera: the averaging argument is not a tessera averaging policy
#include "tessera/policy/config.hpp"
using Cfg = tessera::config<tessera::optim, tessera::fsdp, tessera::full_precision<float>, tessera::ddp>;
static_assert(sizeof(Cfg) > 0);
