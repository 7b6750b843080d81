#!/usr/bin/env bash
# tessera-gpt's CUDA net, on whatever GPUs are present (ranks share them
# through staged MPI when there are fewer GPUs than ranks):
#  - fp32 on the GPU (strict fp32 products) reproduces the host backend's loss
#    curve under sharded strategies, fsdp2, --recompute and accumulation;
#  - bf16 (bf16 activations into the GEMMs) stays within bf16 tolerance of
#    one-rank no_shard on the GPU, and of the host;
#  - the GPU's numpy-checked forward: its validation loss equals the numpy
#    float64 forward from its own --dump-weights;
#  - the loss falls on real text (TEXT: a plain-text file of English).
# Usage: cuda_curves.sh TRAINER MPIEXEC TEXT (a plain-text file, trained on as bytes)
set -uo pipefail
trainer=$1
mpiexec=${2:-mpirun}
text=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
curves="python3 $here/../trainer/compare_curves.py $mpiexec $trainer"
model="--layers 2 --heads 4 --d 128 --seq 64 --accum 2 --steps 20 --log-every 4 --lr 3e-3 --warmup 3 --data $text --text"
fail=0
check() { echo "-- $1"; shift; if ! "$@" | tail -2; then fail=1; fi; }
host="--backend host --wrapper ddp --strategy no_shard --batch 4"

check "fp32: GPU fsdp/optim_grads_params = host no_shard" \
  $curves 1e-4 1 "$host --precision fp32" 1 "--backend cuda --precision fp32 --batch 4" $model
check "fp32: GPU 2 ranks fsdp/optim_grads_params = host no_shard" \
  $curves 1e-4 1 "$host --precision fp32" 2 "--backend cuda --precision fp32 --batch 2" $model
check "fp32: GPU 2 ranks fsdp2 --recompute = host no_shard" \
  $curves 1e-4 1 "$host --precision fp32" 2 "--backend cuda --precision fp32 --batch 2 --wrapper fsdp2 --recompute" $model
check "fp32: GPU --keep-gelu = host no_shard (the forward's GELU outputs, the same bits as recomputed ones)" \
  $curves 1e-4 1 "$host --precision fp32" 1 "--backend cuda --precision fp32 --batch 4 --keep-gelu" $model
check "fp32: GPU 4 ranks ddp/optim_grads = host no_shard" \
  $curves 1e-4 1 "$host --precision fp32" 4 "--backend cuda --precision fp32 --batch 1 --wrapper ddp --strategy optim_grads" $model
check "bf16: GPU 2 ranks fsdp/optim_grads_params = GPU one rank no_shard" \
  $curves 2e-2 1 "--backend cuda --wrapper ddp --strategy no_shard --batch 4 --precision bf16" \
  2 "--backend cuda --precision bf16 --batch 2" $model
check "bf16: GPU --keep-gelu = GPU recomputing them (the epilogue's GELU of fp32 sums against GELU of the bf16 input)" \
  $curves 2e-2 1 "--backend cuda --precision bf16 --batch 4" 1 "--backend cuda --precision bf16 --batch 4 --keep-gelu" $model
check "bf16: GPU = host (bf16 weights; the GPU's activations bf16 too)" \
  $curves 3e-2 1 "$host --precision bf16" 1 "--backend cuda --precision bf16 --batch 4" $model
echo "-- numpy float64 forward of the GPU's weights = the GPU's validation loss"
tmp=$(mktemp -d)
out=$("$trainer" --backend cuda --precision fp32 --layers 2 --heads 4 --d 128 --seq 64 --batch 2 --steps 5 \
  --data "$text" --text --val-data "$text" --val-batches 2 --dump-weights "$tmp/w.safetensors" --json | tail -1)
python3 - "$out" "$tmp/w.safetensors" "$text" "$here/../../examples/gpt" <<'PY' || fail=1
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[4])
import numpy_forward as ref
got = json.loads(sys.argv[1])['val_loss']
w, meta = ref.load(sys.argv[2])
toks = np.frombuffer(open(sys.argv[3], 'rb').read(), dtype=np.uint8).astype(np.int64)
T = int(meta['seq']); windows = len(toks) - T
seqs = np.stack([toks[(i * T) % windows:(i * T) % windows + T + 1] for i in range(4)])
want = ref.loss(w, meta, seqs) / (4 * T)
rel = abs(got - want) / want
print(f'GPU {got:.9f}, numpy {want:.9f}, relative {rel:.1e}')
sys.exit(0 if rel < 1e-5 else 1)
PY
rm -rf "$tmp"
echo "-- the loss falls on real text (bf16, 300 steps)"
"$trainer" --backend cuda --precision bf16 --layers 4 --heads 4 --d 256 --seq 128 --batch 16 --steps 300 \
  --log-every 50 --lr 2e-3 --warmup 20 --min-lr 2e-4 --data "$text" --text --sample 120 | tail -9 || fail=1
exit $fail
