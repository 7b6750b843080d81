#pragma once
//! \file Precision policies: the dtypes of compute weights, main weights and
//! optimizer state, gradients, and the wire of the gradient reduction.
#include "tessera/core/dtype.hpp"

namespace tessera {

//! Compute weights in `Compute` (gathered, used by the trainer's kernels),
//! main weights and optimizer state in `Main`, gradients accumulated in `Grad`,
//! reduced over the wire as `Wire`.
template <class Compute, class Main, class Grad = Main, class Wire = Grad>
struct mixed_precision {
  using tessera_precision = void;
  using compute_type = Compute;
  using main_type = Main;
  using grad_type = Grad;
  using wire_type = Wire;
};

//! Everything in one type.
template <class T>
struct full_precision : mixed_precision<T, T, T, T> {};

//! A tessera precision policy.
template <class P>
concept precision_policy = requires {
  typename P::tessera_precision;
  typename P::compute_type;
  typename P::main_type;
  typename P::grad_type;
  typename P::wire_type;
};

}  // namespace tessera
