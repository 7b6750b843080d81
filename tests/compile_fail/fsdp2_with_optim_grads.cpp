// expect: tessera: fsdp2 (FSDP2's per-parameter row shards) runs optim_grads_params only
#include "tessera/wrapper/data_parallel.hpp"
using Cfg = tessera::config<tessera::optim_grads, tessera::fsdp2>;
tessera::data_parallel_t<Cfg>* p = nullptr;
static_assert(sizeof(Cfg) > 0);
