#!/usr/bin/env bash
# The GPU trainer's correctness, on whatever GPUs are present (ranks share
# them through staged MPI when there are fewer GPUs than ranks):
#  - fp32 on the GPU reproduces the host backend's loss curve;
#  - bf16: every strategy and wrapper at 2 and 3 ranks reproduces the
#    single-rank no_shard curve within bf16 tolerance;
#  - the loss falls on real text (--data: this repository's Markdown and sources).
# Usage: cuda_curves.sh TRAINER [MPIEXEC]
set -euo pipefail
trainer=$1
mpiexec=${2:-mpirun}
here=$(cd "$(dirname "$0")" && pwd)
curves="python3 $here/compare_curves.py $mpiexec $trainer"
model="--layers 2 --d 128 --ctx 8 --tokens 1536 --steps 40 --log-every 4 --lr 3e-3 --warmup 4"
fail=0
check() { echo "-- $1"; shift; if ! "$@" | tail -1; then fail=1; fi; }
# same DESC TOL PRECISION NP "FLAGS" [ARGS...]: NP GPU ranks with FLAGS
# reproduce one GPU rank of no_shard at the same precision, on $model ARGS.
same() {
  local desc=$1 tol=$2 prec=$3 np=$4 flags=$5; shift 5
  check "$desc" $curves "$tol" 1 "--backend cuda --precision $prec --strategy no_shard" \
    "$np" "--backend cuda --precision $prec $flags" $model "$@"
}

check "fp32: GPU (fsdp/optim_grads_params) = host (no_shard)" \
  $curves 1e-4 1 "--backend host --precision fp32 --strategy no_shard --wrapper ddp" \
  1 "--backend cuda --precision fp32 --strategy optim_grads_params --wrapper fsdp" $model
# A wider model: the hidden layer's bias gradient (4d = 2048 columns) is the
# widest column sum; its scratch was once sized for d, which zeroed the logged
# loss and, with NCCL, the training. 2 ranks: NCCL where each has a GPU.
check "fp32 at d 512: GPU (fsdp/optim_grads_params, 2 ranks) = host (no_shard)" \
  $curves 1e-4 1 "--backend host --precision fp32 --strategy no_shard --wrapper ddp" \
  2 "--backend cuda --precision fp32 --strategy optim_grads_params --wrapper fsdp" \
  --layers 4 --d 512 --ctx 8 --tokens 4096 --steps 5 --log-every 1 --lr 1e-3
same "bf16: GELU outputs recomputed in backward = kept" 2e-2 bf16 2 "--strategy optim_grads_params --recompute-gelu"
# Gradient shards in lent activations (memory only: the arithmetic is the
# same); the second check's 8 tokens per rank are too few to hold a block's
# shard, so those units fall back to buffers of their own.
same "fp32: gradient shards lent to activations (optim_grads_params, 2 ranks) = no_shard" 1e-4 fp32 2 \
  "--strategy optim_grads_params --lend-grad-shards"
same "bf16: lent gradient shards, 8 tokens per rank (own-buffer fallback), optim with 2 micro-batches" 2e-2 bf16 2 \
  "--strategy optim --lend-grad-shards" --tokens 32 --accum 2
# All-gathers on copy engines (NCCL symmetric windows; NCCL only, so where
# each rank has its own GPU) with lent gradient shards; and fsdp2 the same way.
if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ]; then
  same "bf16: all-gathers on copy engines + lent shards (2 ranks, NCCL) = no_shard" 2e-2 bf16 2 \
    "--strategy optim_grads_params --copy-engine-gathers --lend-grad-shards"
  same "bf16: fsdp2, copy engines + lent shards + recomputed GELU (2 ranks, NCCL) = no_shard" 2e-2 bf16 2 \
    "--wrapper fsdp2 --strategy optim_grads_params --copy-engine-gathers --lend-grad-shards --recompute-gelu"
fi
same "fp32: fsdp2 (3 ranks) = no_shard" 1e-4 fp32 3 "--wrapper fsdp2 --strategy optim_grads_params"
check "bf16: fused epilogues = separate kernels" \
  $curves 2e-2 1 "--backend cuda --precision bf16 --strategy no_shard --fusion off" \
  1 "--backend cuda --precision bf16 --strategy no_shard --fusion on" $model
for np in 2 3; do
  for sw in ddp:no_shard ddp:optim ddp:optim_grads fsdp:no_shard fsdp:optim fsdp:optim_grads fsdp:optim_grads_params \
            fsdp2:optim_grads_params; do
    check "bf16 np$np ${sw%%:*}/${sw#*:} = np1 no_shard" \
      $curves 2e-2 1 "--backend cuda --precision bf16 --strategy no_shard --wrapper ddp" \
      $np "--backend cuda --precision bf16 --wrapper ${sw%%:*} --strategy ${sw#*:}" $model
  done
done
text=$(mktemp)
cat "$here"/../../README.md "$here"/../../include/tessera/*/*.hpp "$here"/../../examples/mlp_lm/*.* "$here"/../../models/include/mlp_lm/* > "$text"
same "bf16 np2 on real text, 2 micro-batches: the loss falls" 2e-2 bf16 2 "--strategy optim_grads_params" \
  --data "$text" --steps 60 --accum 2
rm -f "$text"
exit $fail
