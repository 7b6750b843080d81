# scripts/gpu-check stage checkpoint (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): the device path of checkpoints (weights and state staged through host
# memory) through the same checks as CI's host run, then save/load throughput of the 1B model
# beside the disk's own speed (bench/checkpoint_io.sh).
if python3 tests/checkpoint/check_checkpoints.py mpirun "$bin/tessera-mlp-lm" "$bin/tessera-consolidate" \
     --backend cuda --precision fp32 >"$LOGS/checkpoints-cuda.log" 2>&1; then
  log "PASS checkpoints (cuda): $(tail -1 "$LOGS/checkpoints-cuda.log")"
else
  log "FAIL checkpoints (cuda)"; grep -E '^FAIL|failed' "$LOGS/checkpoints-cuda.log"; status=1
fi
# Save/load throughput beside dd on the same directory (bench/checkpoint_io.sh): the 1B MLP
# (12.9 GB with AdamW state) and GPT-2 XL (trained one step on $TESSERA_GPT_TEXT as bytes, as
# the gpt stage does; the machine has no GPT-2 tokens).
ckdir=${TESSERA_CKPT_DIR:-/tmp/tessera-ckpt-io}
JSON="$OUT/checkpoint-io-mlp-1b.json" bash bench/checkpoint_io.sh "$bin/tessera-mlp-lm" "$ckdir" 1 --backend cuda \
  --precision bf16 $M1B --tokens 8192 2>&1 | tee -a "$OUT/summary.txt" || status=1
JSON="$OUT/checkpoint-io-gpt2-xl.json" bash bench/checkpoint_io.sh "$bin/tessera-gpt" "$ckdir" 1 --backend cuda \
  --model gpt2-xl --batch 1 --seq 256 --data "${TESSERA_GPT_TEXT:?a plain-text file}" --text 2>&1 | tee -a "$OUT/summary.txt" || status=1
