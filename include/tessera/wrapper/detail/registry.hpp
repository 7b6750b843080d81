#pragma once
//! \file unit_registry: what a trainer registered (units, their named
//! parameters) and, once finalized, their layouts over the world, checked
//! to be the same on every rank.
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "tessera/comm/communicator.hpp"
#include "tessera/comm/staged.hpp"
#include "tessera/comm/trace.hpp"
#include "tessera/core/checksum.hpp"
#include "tessera/core/error.hpp"
#include "tessera/shard/layout.hpp"
#include "tessera/wrapper/options.hpp"

namespace tessera::detail {

class unit_registry {
public:
  unit_id add_unit(std::string name) {
    check_open("add_unit('" + name + "')");
    for (auto& s : specs_) TESSERA_CHECK(s.name != name, "unit '", name, "' registered twice");
    specs_.push_back({std::move(name), {}});
    return unit_id{int(specs_.size()) - 1};
  }
  param_id add_param(unit_id u, std::string name, shape s, bool weight_decay) {
    check_open("add_param('" + name + "')");
    TESSERA_CHECK(u.index >= 0 && std::size_t(u.index) < specs_.size(), "add_param('", name, "'): unknown unit ",
                  u.index);
    auto& unit = specs_[std::size_t(u.index)];
    for (auto& t : unit.tensors)
      TESSERA_CHECK(t.name != name, "parameter '", name, "' registered twice in unit '", unit.name, "'");
    unit.tensors.push_back(tensor_spec{std::move(name), std::move(s), weight_decay});
    return param_id{u.index, int(unit.tensors.size()) - 1};
  }

  //! Lays every unit out over `world` ranks and checks, with one all-reduce
  //! over c, that every rank registered the same units, names and shapes:
  //! where any differs every rank throws, none is left waiting. Collective.
  //! `config` describes what decides the collectives besides the model
  //! (strategy, wrapper, precision, averaging, alignment): it is checked
  //! first, with its own message.
  //! `outer`: a mesh's replica group (may be empty), which must agree too;
  //! `splits`: parts per shard (outer<optim>).
  template <class Comm, class Outer = Comm*>
  void finalize(Comm& c, std::size_t alignment, const std::string& config = {},
                layout_kind kind = layout_kind::flat, std::size_t splits = 1, Outer outer = nullptr) {
    check_open("finalize()");
    TESSERA_CHECK(!specs_.empty(), "finalize() with no unit registered");
    comm::label l("finalize");
    TESSERA_CHECK(comm::all_same(c, checksum64::of(config.data(), config.size())), "ranks disagree on the configuration: rank ", c.rank(),
                  " runs ", config, ", another rank something else; every rank must build the same config<...> and "
                  "wrapper_options");
    for (auto& s : specs_) layouts_.emplace_back(s.name, s.tensors, c.size(), alignment, kind, splits);
    const bool same_model = comm::all_same(c, digest(layouts_));
    if (!same_model) {  // every rank is here: all_same's answer is the same on all
      std::uint64_t as_set = 0;  // order-independent: the units as a set
      for (const auto& L : layouts_) as_set += digest({L});
      std::string order;
      for (std::size_t u = 0; u < layouts_.size() && u < 8; ++u) order += (u ? ", " : "") + layouts_[u].name();
      if (layouts_.size() > 8) order += ", ...";
      TESSERA_CHECK(!comm::all_same(c, as_set), "ranks disagree on the order of the units: rank ", c.rank(),
                    " registered the same units as the others in another order (here: ", order,
                    "); register them in one order on every rank (it is the order of their collectives)");
    }
    TESSERA_CHECK(same_model, "ranks disagree on the model: rank ", c.rank(),
                  " registered a different set of units, parameter names or shapes than another rank (",
                  layouts_.size(), " units, ", num_params(), " elements here)");
    if constexpr (!std::is_pointer_v<Outer>)
    if (outer) {  // and across the replica groups, each of which agreed within itself
      TESSERA_CHECK(comm::all_same(outer, checksum64::of(config.data(), config.size()) ^ digest(layouts_)),
                    "replica groups of the mesh disagree on the configuration or the model: rank ", c.rank(),
                    " of its shard group runs ", config, " with ", layouts_.size(), " units, ", num_params(),
                    " elements; every rank must build the same config<...>, wrapper_options and model");
    }
    finalized_ = true;
  }

  [[nodiscard]] bool finalized() const noexcept { return finalized_; }
  [[nodiscard]] std::size_t num_units() const noexcept { return specs_.size(); }
  [[nodiscard]] std::size_t num_params() const noexcept {
    std::size_t n = 0;
    for (auto& l : layouts_)
      for (auto& t : l.tensors()) n += t.numel;
    return n;
  }
  [[nodiscard]] const std::vector<unit_layout>& layouts() const { return require_final("layouts()"), layouts_; }
  [[nodiscard]] const unit_layout& layout(std::size_t u) const {
    require_final("layout()");
    TESSERA_CHECK(u < layouts_.size(), "unknown unit ", u);
    return layouts_[u];
  }
  [[nodiscard]] const tensor_slot& slot(param_id p) const {
    require_final("slot()");
    TESSERA_CHECK(p.unit >= 0 && std::size_t(p.unit) < layouts_.size() && p.index >= 0 &&
                      std::size_t(p.index) < layouts_[std::size_t(p.unit)].tensors().size(),
                  "unknown parameter (unit ", p.unit, ", index ", p.index, ")");
    return layouts_[std::size_t(p.unit)].tensors()[std::size_t(p.index)];
  }
  //! The parameter called name in unit u.
  [[nodiscard]] param_id find(unit_id u, std::string_view name) const {
    TESSERA_CHECK(u.index >= 0 && std::size_t(u.index) < specs_.size(), "find: unknown unit ", u.index);
    const auto& t = specs_[std::size_t(u.index)].tensors;
    for (std::size_t i = 0; i < t.size(); ++i)
      if (t[i].name == name) return {u.index, int(i)};
    fail("no parameter '" + std::string(name) + "' in unit '" + specs_[std::size_t(u.index)].name + "'");
  }
  void require_final(const char* what) const { TESSERA_CHECK(finalized_, what, " before finalize()"); }

private:
  struct unit_spec {
    std::string name;
    std::vector<tensor_spec> tensors;
  };
  void check_open(const std::string& what) const {
    TESSERA_CHECK(!finalized_, what, " after finalize(): register every unit and parameter before finalize()");
  }

  std::vector<unit_spec> specs_;
  std::vector<unit_layout> layouts_;
  bool finalized_ = false;
};

}  // namespace tessera::detail
