// expect: tessera: the backend argument is not a tessera backend
#include "tessera/policy/config.hpp"
using Cfg = tessera::config<tessera::optim, tessera::fsdp, tessera::full_precision<float>, tessera::sum, int>;
static_assert(sizeof(Cfg) > 0);
