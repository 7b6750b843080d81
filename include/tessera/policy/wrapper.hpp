#pragma once
//! \file Wrapper policy tags: which data-parallel wrapper a config selects.
#include <string_view>

namespace tessera {

//! DDP-style: replicated compute weights, gradients reduced in buckets (units).
struct ddp {
  using tessera_wrapper = void;
  static constexpr std::string_view name = "ddp";
  static constexpr bool row_shards = false;
};
//! FSDP-style (Megatron FSDP's layout): units whose weights are gathered
//! before use and released after; a unit's tensors are packed end to end and
//! cut into equal flat shards, so a shard may start mid-row.
struct fsdp {
  using tessera_wrapper = void;
  static constexpr std::string_view name = "fsdp";
  static constexpr bool row_shards = false;
};
//! FSDP2-style (PyTorch's fully_shard): every parameter split on dim 0, so each
//! rank's shard of a parameter is whole rows; units gathered as with fsdp.
//! Runs optim_grads_params only (see wrapper_supports_v).
struct fsdp2 {
  using tessera_wrapper = void;
  static constexpr std::string_view name = "fsdp2";
  static constexpr bool row_shards = true;
};

//! A tessera wrapper policy (`ddp`, `fsdp` or `fsdp2`).
template <class W>
concept wrapper_policy = requires { typename W::tessera_wrapper; };

}  // namespace tessera
