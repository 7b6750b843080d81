// expect: tessera: shard_view::rows needs whole-row shards, which the fsdp2 wrapper makes
#include "tessera/wrapper/data_parallel.hpp"
using Cfg = tessera::config<tessera::optim_grads_params, tessera::fsdp>;
tessera::row_shard f(tessera::shard_view<Cfg>& v) { return v.rows(tessera::param_id{0, 0}); }
