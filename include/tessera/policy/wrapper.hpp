#pragma once
//! \file Wrapper policy tags: which data-parallel wrapper a config selects.
#include <string_view>

namespace tessera {

//! DDP-style: replicated compute weights, gradients reduced in buckets (units).
struct ddp {
  using tessera_wrapper = void;
  static constexpr std::string_view name = "ddp";
};
//! FSDP-style: units whose weights are gathered before use and released after.
struct fsdp {
  using tessera_wrapper = void;
  static constexpr std::string_view name = "fsdp";
};

//! A tessera wrapper policy (`ddp` or `fsdp`).
template <class W>
concept wrapper_policy = requires { typename W::tessera_wrapper; };

}  // namespace tessera
