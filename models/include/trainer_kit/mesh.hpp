#pragma once
// A trainer's world, flat or a mesh: --shard-group S|node and --outer, as both
// reference trainers take them. The strategy runs inside a shard group of S
// ranks and the outer policy across the replica groups (comm/mesh.hpp);
// every rank still trains its own part of the global batch.
#include <optional>
#include <string>

#include "tessera/comm/mesh.hpp"
#include "tessera/comm/mpi.hpp"
#include "tessera/wrapper/options.hpp"

namespace trainer_kit {

//! f(comm, nullptr) on a flat world (shard_group ""), else f(mesh.shard, &mesh)
//! on the mesh of S = shard_group ranks ("node": one node's ranks), which
//! lives for the call. Collective (the mesh is split from comm).
template <class Comm, class F>
decltype(auto) on_world_or_mesh(const std::string& shard_group, tessera::comm::mpi& world, Comm& comm, F&& f) {
  if (shard_group.empty()) return f(comm, static_cast<tessera::comm::mesh<Comm>*>(nullptr));
  auto m = tessera::comm::make_mesh(comm, shard_group == "node" ? tessera::comm::node_size(world) : std::stoi(shard_group));
  return f(m.shard, &m);
}

//! Builds the wrapper in `holder` over the mesh m when given, else over comm.
template <class Wrapper, class Comm>
Wrapper& emplace_wrapper(std::optional<Wrapper>& holder, Comm& comm, tessera::comm::mesh<Comm>* m,
                         const tessera::wrapper_options& wo) {
  if (m) holder.emplace(*m, wo);
  else holder.emplace(comm, wo);
  return *holder;
}

}  // namespace trainer_kit
