# scripts/gpu-check stage trainer (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): tessera-mlp-lm's loss curves on the GPU against the host's
# (tests/trainer/cuda_curves.sh).
if bash tests/trainer/cuda_curves.sh "$bin/tessera-mlp-lm" >"$LOGS/trainer-curves.log" 2>&1; then
  log "PASS trainer curves: $(grep -c '^worst' "$LOGS/trainer-curves.log") comparisons"
else
  log "FAIL trainer curves"; grep -E '^--|^worst|FAIL' "$LOGS/trainer-curves.log" | tail -40; status=1
fi
grep -E '^--|^worst' "$LOGS/trainer-curves.log" >>"$OUT/summary.txt"
