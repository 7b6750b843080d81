// expect: tessera: the main-weight type must be float or double
#include "tessera/policy/config.hpp"
using Cfg = tessera::config<tessera::optim, tessera::fsdp, tessera::mixed_precision<tessera::bf16, tessera::bf16>>;
static_assert(sizeof(Cfg) > 0);
