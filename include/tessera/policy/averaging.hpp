#pragma once
//! \file Where the 1/N of data parallelism is applied to gradients.
#include <string_view>

namespace tessera {

//! The collective averages (NCCL's avg; sum then scale where the transport lacks it).
struct average_in_collective {
  using tessera_averaging = void;
  static constexpr std::string_view name = "average_in_collective";
};
//! Each rank scales its gradients by 1/N before a sum (guards low-precision wires against overflow).
struct pre_divide {
  using tessera_averaging = void;
  static constexpr std::string_view name = "pre_divide";
};
//! Sum, then scale the reduced gradient by 1/N.
struct post_divide {
  using tessera_averaging = void;
  static constexpr std::string_view name = "post_divide";
};
//! Sum, no 1/N: the trainer already divided its loss by the global batch.
struct sum {
  using tessera_averaging = void;
  static constexpr std::string_view name = "sum";
};

//! A tessera gradient-averaging policy.
template <class A>
concept averaging_policy = requires { typename A::tessera_averaging; };

}  // namespace tessera
