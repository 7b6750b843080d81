// expect: tessera: config was given two policies of one kind
#include "tessera/policy/config.hpp"
using Cfg = tessera::config<tessera::optim, tessera::fsdp, tessera::full_precision<float>, tessera::backend::host,
                            tessera::mixed_precision<tessera::bf16, float>>;
static_assert(sizeof(Cfg) > 0);
