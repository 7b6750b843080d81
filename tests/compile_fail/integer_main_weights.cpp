// expect: tessera: the main-weight type must be float or double
#include "tessera/policy/config.hpp"
using Cfg = tessera::config<tessera::no_shard, tessera::ddp, tessera::full_precision<int>>;
static_assert(sizeof(Cfg) > 0);
