#!/usr/bin/env bash
# How much of the GPU NCCL may hold while it overlaps the GEMMs: the 1B training
# step with optim_grads_params on every GPU of the machine (8192 tokens per
# GPU), for NCCL's own choice of CTAs and for a few caps, each with GEMMs
# shaped for all SMs and for the SMs NCCL leaves. Prints one table per
# setting (see tessera-bench-train) and writes JSON per setting to DIR.
# Usage: overlap_sweep.sh BENCH DIR [SETTINGS...]   (a setting is CTAS:GEMM_SMS; GEMM_SMS -1 = all SMs but CTAS)
set -uo pipefail
bench=$1 dir=$2; shift 2
mkdir -p "$dir"
gpus=$(nvidia-smi -L | grep -c '^GPU')
settings=("$@")
[ ${#settings[@]} -gt 0 ] || settings=("0:0" "16:0" "16:-1" "8:0" "8:-1" "4:-1")
for s in "${settings[@]}"; do
  ctas=${s%%:*} gsms=${s#*:}
  echo "== NCCL CTAs ${ctas} (0: NCCL's choice), GEMM SMs ${gsms} (0: all)"
  mpirun --bind-to none -np "$gpus" "$bench" --layers 8 --d 4096 --ctx 8 --tokens $((8192 * gpus)) --steps 10 \
    --strategies optim_grads_params --nccl-ctas "$ctas" --gemm-sms "$gsms" --json "$dir/sweep-$ctas-$gsms.json" 2>&1 |
    grep -vE '^# (bf16|floor|the same)'
done
