#pragma once
//! \file Optimizer algorithms: their hyper-parameters and the per-element
//! update, one __host__ __device__ functor shared by every backend.
#include <cmath>
#include <string_view>

#include "tessera/core/config.hpp"
#include "tessera/core/dtype.hpp"

namespace tessera {

//! AdamW (decoupled weight decay, bias correction), PyTorch's formulation.
struct adamw {
  using tessera_algorithm = void;
  static constexpr int state_count = 2;  // m, v
  static constexpr std::string_view name = "adamw";
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

//! SGD with momentum, Nesterov and (coupled, L2) weight decay, PyTorch's formulation.
struct sgd {
  using tessera_algorithm = void;
  static constexpr int state_count = 1;  // momentum buffer
  static constexpr std::string_view name = "sgd";
  double lr = 1e-2, momentum = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};

//! A tessera optimizer algorithm.
template <class A>
concept optimizer_algorithm = requires { typename A::tessera_algorithm; A::state_count; };

namespace detail {

//! The AdamW update of one element. grad_scale folds clipping (and loss unscaling) in.
template <class M, class G>
struct adamw_kernel {
  M* w;
  const G* g;
  M* m;
  M* v;
  float lr, beta1, beta2, eps, decay, inv_bc1, inv_bc2_sqrt, grad_scale;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const {
    using F = std::conditional_t<std::is_same_v<M, double>, double, float>;
    const F gi = F(convert<float>(g[i])) * F(grad_scale);
    F wi = F(w[i]);
    wi -= F(lr) * F(decay) * wi;
    const F mi = F(beta1) * F(m[i]) + (F(1) - F(beta1)) * gi;
    const F vi = F(beta2) * F(v[i]) + (F(1) - F(beta2)) * gi * gi;
    m[i] = M(mi);
    v[i] = M(vi);
    wi -= F(lr) * (mi * F(inv_bc1)) / (sqrt(vi) * F(inv_bc2_sqrt) + F(eps));
    w[i] = M(wi);
  }
};

//! The SGD update of one element.
template <class M, class G>
struct sgd_kernel {
  M* w;
  const G* g;
  M* buf;
  float lr, momentum, decay, grad_scale;
  bool nesterov;
  TESSERA_HOST_DEVICE void operator()(std::size_t i) const {
    using F = std::conditional_t<std::is_same_v<M, double>, double, float>;
    F gi = F(convert<float>(g[i])) * F(grad_scale) + F(decay) * F(w[i]);
    if (momentum != 0.0f) {
      const F b = F(momentum) * F(buf[i]) + gi;
      buf[i] = M(b);
      gi = nesterov ? gi + F(momentum) * b : b;
    }
    w[i] = M(F(w[i]) - F(lr) * gi);
  }
};

}  // namespace detail
}  // namespace tessera
