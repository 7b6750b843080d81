// expect: tessera: a config argument is not a tessera policy
#include "tessera/policy/config.hpp"
using Cfg = tessera::config<tessera::optim, tessera::fsdp, tessera::backend::host, tessera::sum,
                            tessera::full_precision<float>, int>;
static_assert(sizeof(Cfg) > 0);
