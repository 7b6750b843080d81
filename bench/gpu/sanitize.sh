# scripts/gpu-check stage sanitize (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): compute-sanitizer memcheck and racecheck over the CUDA suites.
for tool in memcheck racecheck; do
  for t in kernels strategies mlp-kernels; do
    if timeout 600 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 \
         "$bin/test-$t-cuda" >"$LOGS/sanitizer-$tool-$t.log" 2>&1; then
      log "PASS compute-sanitizer $tool $t: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/sanitizer-$tool-$t.log" | tail -1)"
    else
      log "FAIL compute-sanitizer $tool $t (exit $?)"; tail -30 "$LOGS/sanitizer-$tool-$t.log"; status=1
    fi
  done
done
