// expect: tessera: the strategy argument is not a tessera sharding strategy; choose no_shard, optim, optim_grads or optim_grads_params
#include "tessera/policy/config.hpp"
struct zero_four {};
using Cfg = tessera::config<zero_four>;
static_assert(sizeof(Cfg) > 0);
