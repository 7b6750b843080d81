#pragma once
// A unit's gradients as a CUDA net's backward writes them. The library does
// not zero a step's fresh gradients (scope::grads_for_write): the products
// that assign write with beta = 0 where `fresh`, and the parameters whose
// gradients kernels add into (biases, norms, tables) are zeroed here, all in
// one launch.
#include <cuda_runtime.h>

#include <initializer_list>

#include "tessera/wrapper/options.hpp"
#include "trainer_kit/kernels/elementwise.cuh"

namespace trainer_kit {

template <class Wrapper>
struct unit_grads {
  float* data;
  const Wrapper* m;
  bool fresh;  // the step's first micro-batch: nothing to add to
  //! Parameter p's gradients.
  float* operator()(tessera::param_id p) const { return data + m->slot(p).offset; }
};

//! The gradients of the unit `scope` holds; where fresh, `added`'s zeroed first.
template <class Scope, class Wrapper>
unit_grads<Wrapper> write_grads(Scope& scope, const Wrapper& m, std::initializer_list<tessera::param_id> added,
                                cudaStream_t s) {
  const auto target = scope.grads_for_write();
  const unit_grads<Wrapper> g{target.grads.data(), &m, target.fresh};
  if (g.fresh) {
    kernels::float_spans vs;
    for (const tessera::param_id p : added) vs.add(g(p), m.slot(p).numel);
    kernels::zero_spans(vs, s);
  }
  return g;
}

}  // namespace trainer_kit
