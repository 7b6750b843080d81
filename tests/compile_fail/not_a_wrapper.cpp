// expect: tessera: the wrapper argument is not a tessera wrapper policy; choose ddp, fsdp or fsdp2
#include "tessera/policy/config.hpp"
using Cfg = tessera::config<tessera::optim, tessera::optim>;
static_assert(sizeof(Cfg) > 0);
