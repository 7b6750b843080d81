#pragma once
//! \file tessera::config: one type that combines a strategy, a wrapper, a
//! precision, an averaging policy and a backend, and rejects combinations that
//! cannot work with a message that starts with "tessera:" and says what to pick.
#include <string_view>
#include <type_traits>

#include "tessera/core/dtype.hpp"
#include "tessera/policy/averaging.hpp"
#include "tessera/policy/backend.hpp"
#include "tessera/policy/outer.hpp"
#include "tessera/policy/precision.hpp"
#include "tessera/policy/reduction.hpp"
#include "tessera/policy/strategy.hpp"
#include "tessera/policy/wrapper.hpp"

namespace tessera {

namespace detail {
// Evaluated only when the argument is a strategy, so a wrong argument yields
// our one message and not a cascade of "no member named shards_params".
template <class S> constexpr bool shards_params_or_false() {
  if constexpr (sharding_strategy<S>) return S::shards_params;
  else return false;
}

template <class S> constexpr bool shards_grads_or_true() {
  if constexpr (sharding_strategy<S>) return S::shards_grads;
  else return true;
}
template <class W> constexpr bool row_shards_or_false() {
  if constexpr (wrapper_policy<W>) return W::row_shards;
  else return false;
}

template <class P> struct precision_types {
  using compute = float; using main = float; using grad = float; using wire = float;
};
template <precision_policy P> struct precision_types<P> {
  using compute = typename P::compute_type; using main = typename P::main_type;
  using grad = typename P::grad_type; using wire = typename P::wire_type;
};

//! The first of Ps that Is<P>::value picks, else Default.
template <template <class> class Is, class Default, class... Ps> struct first_of { using type = Default; };
template <template <class> class Is, class Default, class P, class... Ps>
struct first_of<Is, Default, P, Ps...> {
  using type = std::conditional_t<Is<P>::value, P, typename first_of<Is, Default, Ps...>::type>;
};
template <class P> struct is_precision : std::bool_constant<precision_policy<P>> {};
template <class P> struct is_averaging : std::bool_constant<averaging_policy<P>> {};
template <class P> struct is_backend : std::bool_constant<backend_policy<P>> {};
template <class P> struct is_outer : std::bool_constant<outer_policy<P>> {};
template <class P> struct is_reduction : std::bool_constant<reduction_policy<P>> {};
template <class P>
constexpr bool is_optional_policy =
    precision_policy<P> || averaging_policy<P> || backend_policy<P> || outer_policy<P> || reduction_policy<P>;
}  // namespace detail

//! Whether wrapper W can run strategy S. DistributedDataParallel keeps
//! replicated compute weights, so it cannot shard parameters. fsdp2 is
//! PyTorch FSDP2: ZeRO-3, optim_grads_params only (FSDP2's
//! reshard_after_forward=False, its ZeRO-2, is optim_grads_params with
//! wrapper_options::gather_buffers >= the number of units: a unit gathered in
//! forward stays gathered for its backward); replicated weights are ddp's and
//! fsdp's. The one place these rules are judged; config, the wrappers and
//! programs that pick at run time (wrapper_supports by name) all ask it.
template <class W, class S>
inline constexpr bool wrapper_supports_v =
    !(std::is_same_v<W, ddp> && detail::shards_params_or_false<S>()) &&
    !(std::is_same_v<W, fsdp2> && sharding_strategy<S> && !detail::shards_params_or_false<S>());
//! wrapper_supports_v by the policies' names ("ddp", "optim_grads_params", ...).
[[nodiscard]] constexpr bool wrapper_supports(std::string_view wrapper, std::string_view strategy) noexcept {
  const auto by = [&]<class W>(W*) {
    return wrapper != W::name ||
           ((strategy != no_shard::name || wrapper_supports_v<W, no_shard>) &&
            (strategy != optim::name || wrapper_supports_v<W, optim>) &&
            (strategy != optim_grads::name || wrapper_supports_v<W, optim_grads>) &&
            (strategy != optim_grads_params::name || wrapper_supports_v<W, optim_grads_params>));
  };
  return by(static_cast<ddp*>(nullptr)) && by(static_cast<fsdp*>(nullptr)) && by(static_cast<fsdp2*>(nullptr));
}

//! The compile-time description of a data-parallel setup: a strategy, a
//! wrapper (default fsdp), then, in any order and each at most once, a
//! precision (default full_precision<float>), an averaging policy (default
//! average_in_collective), a backend (default backend::host) and an outer
//! policy for meshes (default outer<no_shard>; policy/outer.hpp) and a
//! reduction policy (default float_reduction; policy/reduction.hpp):
//!   config<optim_grads_params, fsdp, backend::cuda, mixed_precision<bf16, float>>
//!   config<optim_grads_params, fsdp, outer<optim>>   (HFSDP on a mesh)
//! The positional form config<S, W, P, A, B> is the same thing written in order.
template <class Strategy, class Wrapper = fsdp, class... Policies>
struct config {
  static_assert(sharding_strategy<Strategy>,
                "tessera: the strategy argument is not a tessera sharding strategy; "
                "choose no_shard, optim, optim_grads or optim_grads_params");
  static_assert(wrapper_policy<Wrapper>,
                "tessera: the wrapper argument is not a tessera wrapper policy; choose ddp, fsdp or fsdp2");
  static_assert(!std::is_same_v<Wrapper, ddp> || wrapper_supports_v<Wrapper, Strategy>,
                "tessera: DistributedDataParallel keeps replicated compute weights and cannot "
                "shard parameters; choose the fsdp or fsdp2 wrapper for optim_grads_params, or the "
                "optim_grads strategy with ddp");
  static_assert(!std::is_same_v<Wrapper, fsdp2> || wrapper_supports_v<Wrapper, Strategy>,
                "tessera: fsdp2 (FSDP2's per-parameter row shards) runs optim_grads_params only: FSDP2 is "
                "ZeRO-3, and its reshard_after_forward=False is optim_grads_params with "
                "wrapper_options::gather_buffers >= the number of units; choose ddp or fsdp for no_shard, "
                "optim and optim_grads");

private:
  static constexpr int precisions = (0 + ... + int(precision_policy<Policies>));
  static constexpr int averagings = (0 + ... + int(averaging_policy<Policies>));
  static constexpr int backends = (0 + ... + int(backend_policy<Policies>));
  static constexpr int outers = (0 + ... + int(outer_policy<Policies>));
  static constexpr int reductions = (0 + ... + int(reduction_policy<Policies>));
  static constexpr bool all_known = (true && ... && detail::is_optional_policy<Policies>);
  // An argument that is no policy is named after the first kind not yet given
  // (so the positional form reads as before); exactly one message fires.
  static_assert(all_known || precisions > 0,
                "tessera: the precision argument is not a tessera precision policy; "
                "choose full_precision<float> or mixed_precision<bf16, float>");
  static_assert(all_known || precisions == 0 || averagings > 0,
                "tessera: the averaging argument is not a tessera averaging policy; choose "
                "average_in_collective, pre_divide, post_divide or sum");
  static_assert(all_known || precisions == 0 || averagings == 0 || backends > 0,
                "tessera: the backend argument is not a tessera backend; choose backend::host or backend::cuda");
  static_assert(all_known || precisions == 0 || averagings == 0 || backends == 0,
                "tessera: a config argument is not a tessera policy; after the strategy and the wrapper, config "
                "takes a precision, an averaging policy and a backend, each at most once");
  static_assert(precisions <= 1 && averagings <= 1 && backends <= 1 && outers <= 1 && reductions <= 1,
                "tessera: config was given two policies of one kind; give each of precision, averaging, "
                "backend, outer and reduction at most once (in any order)");

public:
  using strategy = Strategy;
  using wrapper = Wrapper;
  using precision = typename detail::first_of<detail::is_precision, full_precision<float>, Policies...>::type;
  using averaging = typename detail::first_of<detail::is_averaging, average_in_collective, Policies...>::type;
  using backend_type = typename detail::first_of<detail::is_backend, backend::host, Policies...>::type;
  //! Across the replica groups of a mesh (policy/outer.hpp); nothing on a flat world.
  using outer_type = typename detail::first_of<detail::is_outer, outer<no_shard>, Policies...>::type;
  //! How world-size-dependent sums are computed (policy/reduction.hpp).
  using reduction = typename detail::first_of<detail::is_reduction, float_reduction, Policies...>::type;
  using compute_type = typename detail::precision_types<precision>::compute;
  using main_type = typename detail::precision_types<precision>::main;
  using grad_type = typename detail::precision_types<precision>::grad;
  using wire_type = typename detail::precision_types<precision>::wire;

  static_assert(!outer_type::splits_optimizer || detail::shards_grads_or_true<Strategy>(),
                "tessera: outer<optim> (HFSDP) splits the gradient shard of a sharded-gradient strategy again "
                "across replica groups; choose optim_grads or optim_grads_params inside the shard group (for "
                "no_shard or optim, shard the optimizer over the whole world: optim on a flat world)");
  static_assert(!outer_type::splits_optimizer || !detail::row_shards_or_false<Wrapper>(),
                "tessera: fsdp2 keeps whole rows per rank, which outer<optim> would cut; fsdp2 on a mesh is "
                "outer<no_shard> (PyTorch FSDP2's (Replicate, Shard) mesh); use fsdp for HFSDP");
  static_assert(std::is_same_v<main_type, float> || std::is_same_v<main_type, double>,
                "tessera: the main-weight type must be float or double (an inexact or integer "
                "type loses small updates); choose mixed_precision<bf16, float> for bf16 compute");
  static_assert(floating_element<compute_type>,
                "tessera: the compute-weight type must be float, double, bf16 or fp16");
  static_assert(!reduction::exact || std::is_same_v<grad_type, wire_type>,
                "tessera: exact_reduction sends integer limbs, not the precision's wire dtype; give the precision a "
                "wire type equal to its gradient type (mixed_precision<bf16, float> has float for both)");
  static_assert(floating_element<grad_type> && floating_element<wire_type>,
                "tessera: gradient and wire types must be float, double, bf16 or fp16");
};

template <class T> struct is_config : std::false_type {};
template <class S, class W, class... Ps>
struct is_config<config<S, W, Ps...>> : std::true_type {};

//! A tessera::config.
template <class C>
concept config_type = is_config<C>::value;

}  // namespace tessera
