#pragma once
//! \file Forward declarations of the public class templates and tags.
namespace tessera {
struct bf16;
struct fp16;
struct no_shard;
struct optim;
struct optim_grads;
struct optim_grads_params;
struct ddp;
struct fsdp;
struct average_in_collective;
struct pre_divide;
struct post_divide;
struct sum;
struct adamw;
struct sgd;
namespace backend {
struct host;
struct cuda;
}  // namespace backend
template <class Strategy, class Wrapper, class Precision, class Averaging, class Backend> struct config;
}  // namespace tessera
