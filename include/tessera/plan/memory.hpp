#pragma once
//! \file Memory per rank of a config and a model, planned without a
//! communicator, a GPU or an allocation: the wrapper's buffers by the rules
//! its engine allocates with (wrapper/detail/storage.hpp) over the layouts
//! its registry would build, and ShardedOptimizer's state by its own count.
//! So for the same model, config, world and options the plan equals
//! model.planned() and opt.state_bytes() of a real run, byte for byte
//! (tests/test_plan.cpp checks it at 1-6 ranks, meshes included).
//! Activations are the trainer's: add them (tessera-plan does for the
//! reference model).
#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "tessera/backend/host/ops.hpp"
#include "tessera/core/error.hpp"
#include "tessera/optim/algorithms.hpp"
#include "tessera/optim/sharded_optimizer.hpp"
#include "tessera/policy/config.hpp"
#include "tessera/shard/layout.hpp"
#include "tessera/wrapper/data_parallel.hpp"
#include "tessera/wrapper/detail/storage.hpp"
#include "tessera/wrapper/options.hpp"

namespace tessera::plan {

//! A unit as registered: its name and tensors (name, shape, weight decay),
//! in registration order.
struct unit_spec {
  std::string name;
  std::vector<tensor_spec> tensors;
};

//! Records add_unit / add_param calls as unit specs, so that code which
//! registers a model on a wrapper (the reference model's register_model)
//! describes it to the planner unchanged.
class model_recorder {
public:
  unit_id add_unit(std::string name) {
    units_.push_back({std::move(name), {}});
    return unit_id{int(units_.size()) - 1};
  }
  param_id add_param(unit_id u, std::string name, shape s, bool weight_decay = true) {
    TESSERA_CHECK(u.index >= 0 && std::size_t(u.index) < units_.size(), "add_param('", name, "'): unknown unit");
    auto& t = units_[std::size_t(u.index)].tensors;
    t.push_back(tensor_spec{std::move(name), std::move(s), weight_decay});
    return param_id{u.index, int(t.size()) - 1};
  }
  [[nodiscard]] const std::vector<unit_spec>& units() const noexcept { return units_; }

private:
  std::vector<unit_spec> units_;
};

//! One rank's planned bytes.
struct rank_memory {
  memory_plan model;            //!< the wrapper's buffers (what model.planned() reports)
  std::size_t optimizer = 0;    //!< ShardedOptimizer's state, decay masks and norm scalars (opt.state_bytes())
  std::size_t optimizer_host = 0;  //!< its offloaded state and staging in host memory (opt.offloaded_bytes())
  //! The backend's memory.
  [[nodiscard]] std::size_t total() const noexcept { return model.total() + optimizer; }
  //! Host memory the offload takes (wrapper_options::offload_optimizer).
  [[nodiscard]] std::size_t host_total() const noexcept { return model.host_main_weights + optimizer_host; }
};

namespace detail {
// The same policies on the host backend: the rules are the backend's
// neither, and a host-only program can plan a CUDA config.
template <config_type Cfg>
using host_twin = config<typename Cfg::strategy, typename Cfg::wrapper, typename Cfg::precision, typename Cfg::averaging,
                         backend::host, typename Cfg::outer_type, typename Cfg::reduction>;
}  // namespace detail

//! The layouts the wrapper's registry would build for these units over a
//! shard group of `group` ranks (shards split into `replicas` parts under
//! outer<optim>): each unit's padding, shards and tensor offsets.
template <config_type Cfg>
[[nodiscard]] std::vector<unit_layout> layouts(const std::vector<unit_spec>& units, int group,
                                               const wrapper_options& o = {}, int replicas = 1) {
  TESSERA_CHECK(group >= 1 && replicas >= 1, "plan::memory: ", group, " ranks per group, ", replicas, " groups");
  TESSERA_CHECK(!units.empty(), "plan::memory: no unit");
  const std::size_t splits = Cfg::outer_type::splits_optimizer && replicas > 1 ? std::size_t(replicas) : 1;
  std::vector<unit_layout> out;
  for (const auto& u : units)
    out.emplace_back(u.name, u.tensors, group, o.alignment,
                     Cfg::wrapper::row_shards ? layout_kind::rows : layout_kind::flat, splits);
  return out;
}

//! The busiest rank's bytes for config Cfg (wrapper and strategy inside it)
//! and algorithm A over a shard group of `group` ranks, on a mesh of
//! `replicas` groups (1: a flat world; under outer<optim> each shard splits
//! into `replicas` parts). Options as given to the wrapper and the optimizer.
template <config_type Cfg, optimizer_algorithm A = adamw>
[[nodiscard]] rank_memory memory(const std::vector<unit_spec>& units, int group, const wrapper_options& o = {},
                                 int replicas = 1, const optimizer_options& oo = {}) {
  const std::vector<unit_layout> ls = plan::layouts<Cfg>(units, group, o, replicas);
  const std::size_t splits = ls.front().splits();
  rank_memory m;
  using H = detail::host_twin<Cfg>;
  m.model = tessera::detail::storage<H>::plan(ls, group, o);
  using opt_type = ShardedOptimizer<A, data_parallel_t<H>>;
  for (int r = 0; r < group; ++r)  // ranges are equal; the decay masks may differ by a word
    for (std::size_t part = 0; part < splits; ++part) {
      const auto b = opt_type::planned_state(ls, r, int(part), o, oo);
      m.optimizer = std::max(m.optimizer, b.device);
      m.optimizer_host = std::max(m.optimizer_host, b.host);
    }
  return m;
}

}  // namespace tessera::plan
