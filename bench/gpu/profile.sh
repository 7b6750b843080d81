# scripts/gpu-check stage profile (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status).
# One steady step of tessera-bench-train (34M and 1B, optim_grads_params, eager: every kernel its
# own launch) under Nsight Compute, each kernel timed alone (the last step is the NVTX range
# "tessera-step"), then bench/ncu_step_summary.py's table by kernel class and the fused or
# separate form each product ran in (the first step's timing, taken under ncu, decides it).
# TESSERA_PROFILE_MODELS="34m 1b" picks models.
if ! command -v ncu >/dev/null; then
  log "FAIL profile: no ncu"; status=1
else
  for model in ${TESSERA_PROFILE_MODELS:-34m 1b}; do
    case $model in
      1b) shape="$M1B --tokens 8192" ;;
      34m) shape="$M34M --tokens 4096" ;;
      *) log "FAIL profile: model '$model' (1b or 34m)"; status=1; continue ;;
    esac
    if ncu --nvtx --nvtx-include "tessera-step/" --clock-control none --metrics gpu__time_duration.sum --csv \
         "$bin/tessera-bench-train" $shape --steps 2 --warmup 1 --strategies optim_grads_params --cuda-graphs off \
         --json "$OUT/profile-$model.json" >"$OUT/profile-$model.csv" 2>"$LOGS/profile-$model.err"; then
      python3 bench/ncu_step_summary.py "$OUT/profile-$model.csv" "$OUT/profile-$model.json" >"$OUT/profile-$model.txt" &&
        { log "profile $model:"; sed -n '/^| kernels/,$p' "$OUT/profile-$model.txt" | tee -a "$OUT/summary.txt"; } || status=1
    else
      log "FAIL profile $model"; tail -5 "$LOGS/profile-$model.err"; status=1
    fi
  done
fi
