# scripts/gpu-check stage checkpoint (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): the device path of checkpoints (weights and state staged through host
# memory) through the same checks as CI's host run, then save/load throughput of the 1B model
# beside the disk's own speed (bench/checkpoint_io.sh).
# The device path (weights and state staged through host memory) through the
# same checks as CI's host run, then save/load throughput of the 1B model
# beside the disk's own speed.
if python3 tests/checkpoint/check_checkpoints.py mpirun "$bin/tessera-mlp-lm" "$bin/tessera-consolidate" \
     --backend cuda --precision fp32 >"$LOGS/checkpoints-cuda.log" 2>&1; then
  log "PASS checkpoints (cuda): $(tail -1 "$LOGS/checkpoints-cuda.log")"
else
  log "FAIL checkpoints (cuda)"; grep -E '^FAIL|failed' "$LOGS/checkpoints-cuda.log"; status=1
fi
bash bench/checkpoint_io.sh "$bin/tessera-mlp-lm" "${TESSERA_CKPT_DIR:-/tmp/tessera-ckpt-io}" 1 --backend cuda \
  --precision bf16 $M1B --tokens 8192 2>&1 | tee -a "$OUT/summary.txt" || status=1
