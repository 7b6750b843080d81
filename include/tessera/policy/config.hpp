#pragma once
//! \file tessera::config: one type that combines a strategy, a wrapper, a
//! precision, an averaging policy and a backend, and rejects combinations that
//! cannot work with a message that starts with "tessera:" and says what to pick.
#include <type_traits>

#include "tessera/core/dtype.hpp"
#include "tessera/policy/averaging.hpp"
#include "tessera/policy/backend.hpp"
#include "tessera/policy/precision.hpp"
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
template <class P> struct precision_types {
  using compute = float; using main = float; using grad = float; using wire = float;
};
template <precision_policy P> struct precision_types<P> {
  using compute = typename P::compute_type; using main = typename P::main_type;
  using grad = typename P::grad_type; using wire = typename P::wire_type;
};
}  // namespace detail

//! The compile-time description of a data-parallel setup.
template <class Strategy, class Wrapper = fsdp, class Precision = full_precision<float>,
          class Averaging = average_in_collective, class Backend = backend::host>
struct config {
  static_assert(sharding_strategy<Strategy>,
                "tessera: the strategy argument is not a tessera sharding strategy; "
                "choose no_shard, optim, optim_grads or optim_grads_params");
  static_assert(wrapper_policy<Wrapper>,
                "tessera: the wrapper argument is not a tessera wrapper policy; choose ddp or fsdp");
  static_assert(precision_policy<Precision>,
                "tessera: the precision argument is not a tessera precision policy; "
                "choose full_precision<float> or mixed_precision<bf16, float>");
  static_assert(averaging_policy<Averaging>,
                "tessera: the averaging argument is not a tessera averaging policy; choose "
                "average_in_collective, pre_divide, post_divide or sum");
  static_assert(backend_policy<Backend>,
                "tessera: the backend argument is not a tessera backend; choose backend::host or backend::cuda");
  static_assert(!(std::is_same_v<Wrapper, ddp> && detail::shards_params_or_false<Strategy>()),
                "tessera: DistributedDataParallel keeps replicated compute weights and cannot "
                "shard parameters; choose the fsdp wrapper for optim_grads_params, or the "
                "optim_grads strategy with ddp");

  using strategy = Strategy;
  using wrapper = Wrapper;
  using precision = Precision;
  using averaging = Averaging;
  using backend_type = Backend;
  using compute_type = typename detail::precision_types<Precision>::compute;
  using main_type = typename detail::precision_types<Precision>::main;
  using grad_type = typename detail::precision_types<Precision>::grad;
  using wire_type = typename detail::precision_types<Precision>::wire;

  static_assert(std::is_same_v<main_type, float> || std::is_same_v<main_type, double>,
                "tessera: the main-weight type must be float or double (an inexact or integer "
                "type loses small updates); choose mixed_precision<bf16, float> for bf16 compute");
  static_assert(floating_element<compute_type>,
                "tessera: the compute-weight type must be float, double, bf16 or fp16");
  static_assert(floating_element<grad_type> && floating_element<wire_type>,
                "tessera: gradient and wire types must be float, double, bf16 or fp16");
};

template <class T> struct is_config : std::false_type {};
template <class S, class W, class P, class A, class B>
struct is_config<config<S, W, P, A, B>> : std::true_type {};

//! A tessera::config.
template <class C>
concept config_type = is_config<C>::value;

}  // namespace tessera
