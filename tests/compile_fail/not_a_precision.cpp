// expect: tessera: the precision argument is not a tessera precision policy
#include "tessera/policy/config.hpp"
using Cfg = tessera::config<tessera::optim, tessera::fsdp, float>;
static_assert(sizeof(Cfg) > 0);
