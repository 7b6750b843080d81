# scripts/gpu-check stage train (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): the training-step benchmark (tessera-bench-train) at the 1B and 34M MLP
# beside its floor and PyTorch (bench/torch_mlp_lm.py), then the trainer itself;
# TESSERA_TORCH_COMPILE=1 also times torch.compile (slow to compile).
# The reference model at the two sizes of the trainer issue: Tessera per
# strategy beside the floor measured in the same run, then PyTorch, then
# the trainer itself (its own log line and summary).
T=$LOGS/train; mkdir -p "$T"
compile=${TESSERA_TORCH_COMPILE:+--compile}
for spec in "1b $M1B --tokens 8192" "34m $M34M --tokens 4096"; do
  set -- $spec; name=$1; shift
  "$bin/tessera-bench-train" "$@" --steps 20 --json "$T/tessera-$name.json" 2>&1 | tee -a "$OUT/train.txt" || status=1
  python3 bench/torch_mlp_lm.py "$@" --steps 20 $compile --json "$T/torch-$name.json" 2>&1 | tee -a "$OUT/train.txt" || true
  "$bin/tessera-mlp-lm" --backend cuda --precision bf16 --strategy no_shard "$@" --steps 12 --log-every 4 \
    2>&1 | tee -a "$OUT/train.txt" || status=1
done
tar -czf "$OUT/train.tar.gz" -C "$T" .
