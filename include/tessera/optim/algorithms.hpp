#pragma once
//! \file Optimizer algorithms: their hyper-parameters and the per-element
//! update, one __host__ __device__ functor per algorithm shared by every
//! backend. Each functor updates the whole optimizer range of a unit in one
//! pass; per-tensor weight decay comes from a bit mask (decay_mask), and
//! where compute weights have another dtype the functor writes them too.
//!
//! An algorithm is open for extension: any type that satisfies
//! optimizer_algorithm works with ShardedOptimizer and checkpoints, without
//! touching this folder. It carries
//!   using tessera_algorithm = void;
//!   static constexpr int state_count;                      // fp32 state tensors per parameter
//!   static constexpr std::string_view name;                // recorded in checkpoints
//!   static constexpr std::string_view state_names[state_count];  // checkpoint entry names
//!   double lr;                                             // the base learning rate
//!   std::array<double, K> settings() const;                // optional: every setting, compared across ranks
//!   template <class M, class G, class C> F kernel(const update_args<M, G, C>&) const;
//! where F is a copyable functor with `void operator()(std::size_t i) const`
//! (marked TESSERA_HOST_DEVICE to run on the CUDA backend).
//!
//! An algorithm may also say what of its update changes from step to step:
//!   static constexpr int scalar_count;                     // 1..max_step_scalars
//!   void step_scalars(long step, double lr, float* out) const;  // on the host
//! Then the host computes those scalars ahead for the step numbers that may
//! come next, the device picks the set for the step it applies, and the
//! functor reads them from update_args::scalars (backend memory) instead of
//! the lr and step it was built with. Its launch is then the same every step,
//! so a step can be captured in a CUDA graph and replayed (optim/step_graph.cuh),
//! and the host never waits for the last step's outcome before issuing the
//! next. adamw and sgd do this; an algorithm without it still works, with one
//! host wait per step and no graphs.
//!
//! A functor that
//! also has `static constexpr int vector_width`, `bool vector_ok` and
//! `template <int V, bool Stream> void run(std::size_t base) const` gets the
//! CUDA backend's vectorised launch. adamw and sgd below are written so.
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "tessera/core/config.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/vec.hpp"

namespace tessera {

//! Which elements of a unit's optimizer range take weight decay: one bit per
//! granule of 2^shift elements (the layout's alignment, so no granule holds
//! two tensors; padding may take either flag, its values stay zero). Null
//! bits: everything decays. One 32-bit word covers 32 granules, so the lookup
//! costs a cached load per many elements, whatever the number of tensors.
struct decay_mask {
  const std::uint32_t* bits = nullptr;
  unsigned shift = 0;
  TESSERA_HOST_DEVICE bool decays(std::uint64_t i) const {
    if (!bits) return true;
    const std::uint64_t g = i >> shift;
    return (bits[g >> 5] >> (g & 31)) & 1u;
  }
};

//! What an algorithm's kernel updates: one unit's optimizer range on this
//! rank, n elements of each buffer (backend memory).
template <class M, class G, class C>
struct update_args {
  M* weights;           //!< main weights, updated in place
  const G* grads;       //!< reduced gradients
  M* const* state;      //!< state_count buffers of optimizer state, updated in place
  C* compute_out;       //!< where to write the new weights in the compute dtype; null: none
  decay_mask decay;     //!< which elements take weight decay
  double lr;            //!< learning rate of this step (after the schedule)
  //! Multiply every gradient by *grad_scale (global-norm clipping; 1 when not
  //! clipped). Backend memory: the clip coefficient is decided on the device
  //! after the norm, so a kernel reads it there, once per thread or chunk.
  const float* grad_scale;
  long step;            //!< 1-based number of this step (bias corrections)
  //! Where the algorithm declares step_scalars: its scalar_count scalars for
  //! the step being applied (backend memory, chosen on the device); lr and
  //! step above are then only the host's view at issue, and are not to be read.
  const float* scalars = nullptr;
};

//! The most step scalars an algorithm may declare.
inline constexpr int max_step_scalars = 8;

//! Whether A declares its per-step scalars (see the top of this file).
template <class A>
concept has_step_scalars = requires(const A& a, float* out) {
  { A::scalar_count } -> std::convertible_to<int>;
  a.step_scalars(1L, 1.0, out);
} && (A::scalar_count >= 1 && A::scalar_count <= max_step_scalars);

template <class M, class G, class C> struct adamw_kernel;
template <class M, class G, class C> struct sgd_kernel;

//! AdamW (decoupled weight decay, bias correction), PyTorch's formulation.
struct adamw {
  using tessera_algorithm = void;
  static constexpr int state_count = 2;  // m, v
  static constexpr std::string_view name = "adamw";
  //! State names, as PyTorch's state_dict calls them (checkpoints use them).
  static constexpr std::string_view state_names[state_count] = {"exp_avg", "exp_avg_sq"};
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  //! Every setting, for the agreement across ranks (ShardedOptimizer::decide).
  [[nodiscard]] std::array<double, 5> settings() const { return {lr, beta1, beta2, eps, weight_decay}; }

  //! lr, 1 / (1 - beta1^step), 1 / sqrt(1 - beta2^step): computed on the host in double, as the kernel used to be built.
  static constexpr int scalar_count = 3;
  void step_scalars(long step, double step_lr, float* out) const {
    const double bc1 = 1 - std::pow(beta1, double(step)), bc2 = 1 - std::pow(beta2, double(step));
    out[0] = float(step_lr);
    out[1] = float(1 / bc1);
    out[2] = float(1 / std::sqrt(bc2));
  }

  template <class M, class G, class C>
  [[nodiscard]] adamw_kernel<M, G, C> kernel(const update_args<M, G, C>& a) const;
};

//! SGD with momentum, Nesterov and (coupled, L2) weight decay, PyTorch's formulation.
struct sgd {
  using tessera_algorithm = void;
  static constexpr int state_count = 1;  // momentum buffer
  static constexpr std::string_view name = "sgd";
  static constexpr std::string_view state_names[state_count] = {"momentum_buffer"};
  double lr = 1e-2, momentum = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  [[nodiscard]] std::array<double, 4> settings() const { return {lr, momentum, weight_decay, nesterov ? 1.0 : 0.0}; }

  static constexpr int scalar_count = 1;  // lr
  void step_scalars(long, double step_lr, float* out) const { out[0] = float(step_lr); }

  template <class M, class G, class C>
  [[nodiscard]] sgd_kernel<M, G, C> kernel(const update_args<M, G, C>& a) const;
};

//! A tessera optimizer algorithm (see the top of this file).
template <class A>
concept optimizer_algorithm = requires(const A& a, const update_args<float, float, float>& args) {
  typename A::tessera_algorithm;
  { A::state_count } -> std::convertible_to<int>;
  { A::name } -> std::convertible_to<std::string_view>;
  { A::state_names[0] } -> std::convertible_to<std::string_view>;
  { a.lr } -> std::convertible_to<double>;
  a.template kernel<float, float, float>(args);
} && (A::state_count >= 1 && A::state_count <= 15);

namespace detail {

template <class M> using math_t = std::conditional_t<std::is_same_v<M, double>, double, float>;

template <class F> TESSERA_HOST_DEVICE inline F root(F x) {
#if defined(__CUDA_ARCH__)
  return sqrt(x);
#else
  return std::sqrt(x);
#endif
}

}  // namespace detail

//! AdamW over one unit's optimizer range. grad_scale folds clipping in; out,
//! when not null, receives the new weights in the compute dtype C.
template <class M, class G, class C>
struct adamw_kernel {
  M* w;
  const G* g;
  M* m;
  M* v;
  C* out;
  decay_mask decay;
  const float* grad_scale;  //!< backend memory (update_args::grad_scale)
  float lr, beta1, beta2, eps, weight_decay, inv_bc1, inv_bc2_sqrt;
  const float* scalars = nullptr;  //!< backend memory: lr, inv_bc1, inv_bc2_sqrt of the step applied (update_args::scalars)
  bool vector_ok = false;  //!< every pointer aligned for vector_width-wide accesses
  static constexpr int vector_width = 4;

  struct per_step {
    float scale, lr, inv_bc1, inv_bc2_sqrt;
  };
  // Once per thread or chunk: the stores below may alias these as far as the compiler knows.
  TESSERA_HOST_DEVICE per_step load() const {
    return scalars ? per_step{*grad_scale, scalars[0], scalars[1], scalars[2]}
                   : per_step{*grad_scale, lr, inv_bc1, inv_bc2_sqrt};
  }
  TESSERA_HOST_DEVICE void update(M& wi, G graw, M& mi, M& vi, std::uint64_t i, const per_step& k) const {
    using F = detail::math_t<M>;
    const F gi = F(convert<float>(graw)) * F(k.scale);
    F x = F(wi);
    if (decay.decays(i)) x -= F(k.lr) * F(weight_decay) * x;
    const F mn = F(beta1) * F(mi) + (F(1) - F(beta1)) * gi;
    const F vn = F(beta2) * F(vi) + (F(1) - F(beta2)) * gi * gi;
    mi = M(mn);
    vi = M(vn);
    x -= F(k.lr) * (mn * F(k.inv_bc1)) / (detail::root(vn) * F(k.inv_bc2_sqrt) + F(eps));
    wi = M(x);
  }
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const {
    update(w[i], g[i], m[i], v[i], i, load());
    if (out) out[i] = convert<C>(w[i]);
  }
  //! V consecutive elements from `base` (a multiple of V) with vector accesses.
  template <int V, bool Stream = false>
  TESSERA_HOST_DEVICE void run(std::size_t base) const {
    const per_step k = load();
    auto W = load_vec<V, Stream>(w + base);
    const auto Gv = load_vec<V, Stream>(g + base);
    auto Mv = load_vec<V, Stream>(m + base);
    auto Vv = load_vec<V, Stream>(v + base);
    TESSERA_UNROLL
    for (int l = 0; l < V; ++l) update(W.v[l], Gv.v[l], Mv.v[l], Vv.v[l], base + std::size_t(l), k);
    store_vec<V, Stream>(w + base, W);
    store_vec<V, Stream>(m + base, Mv);
    store_vec<V, Stream>(v + base, Vv);
    if (out) {
      vec<C, V> o;
      TESSERA_UNROLL
      for (int l = 0; l < V; ++l) o.v[l] = convert<C>(W.v[l]);
      store_vec<V>(out + base, o);  // the compute shard is read again soon (all-gather)
    }
  }
};

//! SGD over one unit's optimizer range.
template <class M, class G, class C>
struct sgd_kernel {
  M* w;
  const G* g;
  M* buf;
  C* out;
  decay_mask decay;
  const float* grad_scale;  //!< backend memory (update_args::grad_scale)
  float lr, momentum, weight_decay;
  bool nesterov;
  const float* scalars = nullptr;  //!< backend memory: the lr of the step applied (update_args::scalars)
  bool vector_ok = false;
  static constexpr int vector_width = 4;

  struct per_step {
    float scale, lr;
  };
  TESSERA_HOST_DEVICE per_step load() const { return {*grad_scale, scalars ? scalars[0] : lr}; }
  TESSERA_HOST_DEVICE void update(M& wi, G graw, M& bi, std::uint64_t i, const per_step& k) const {
    using F = detail::math_t<M>;
    F gi = F(convert<float>(graw)) * F(k.scale);
    if (decay.decays(i)) gi += F(weight_decay) * F(wi);
    if (momentum != 0.0f) {
      const F b = F(momentum) * F(bi) + gi;
      bi = M(b);
      gi = nesterov ? gi + F(momentum) * b : b;
    }
    wi = M(F(wi) - F(k.lr) * gi);
  }
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const {
    update(w[i], g[i], buf[i], i, load());
    if (out) out[i] = convert<C>(w[i]);
  }
  template <int V, bool Stream = false>
  TESSERA_HOST_DEVICE void run(std::size_t base) const {
    const per_step k = load();
    auto W = load_vec<V, Stream>(w + base);
    const auto Gv = load_vec<V, Stream>(g + base);
    auto B = load_vec<V, Stream>(buf + base);
    TESSERA_UNROLL
    for (int l = 0; l < V; ++l) update(W.v[l], Gv.v[l], B.v[l], base + std::size_t(l), k);
    store_vec<V, Stream>(w + base, W);
    store_vec<V, Stream>(buf + base, B);
    if (out) {
      vec<C, V> o;
      TESSERA_UNROLL
      for (int l = 0; l < V; ++l) o.v[l] = convert<C>(W.v[l]);
      store_vec<V>(out + base, o);
    }
  }
};

template <class M, class G, class C>
adamw_kernel<M, G, C> adamw::kernel(const update_args<M, G, C>& a) const {
  float per_step[scalar_count] = {0, 1, 1};
  if (!a.scalars) step_scalars(a.step, a.lr, per_step);
  adamw_kernel<M, G, C> k{a.weights, a.grads, a.state[0], a.state[1], a.compute_out, a.decay, a.grad_scale,
                          per_step[0], float(beta1), float(beta2), float(eps), float(weight_decay), per_step[1],
                          per_step[2], a.scalars};
  k.vector_ok = aligned_for<k.vector_width>(k.w, k.g, k.m, k.v, k.out);  // a null out is aligned
  return k;
}

template <class M, class G, class C>
sgd_kernel<M, G, C> sgd::kernel(const update_args<M, G, C>& a) const {
  sgd_kernel<M, G, C> k{a.weights, a.grads, a.state[0], a.compute_out, a.decay, a.grad_scale, float(a.lr),
                        float(momentum), float(weight_decay), nesterov, a.scalars};
  k.vector_ok = aligned_for<k.vector_width>(k.w, k.g, k.buf, k.out);
  return k;
}

}  // namespace tessera
