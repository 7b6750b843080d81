# scripts/gpu-check stage faults (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): tests/fault/check_faults.py on the GPU trainer (NCCL at one rank per GPU).
# Never hang on GPUs: a stopped, killed or failing rank and a divergent
# program end the job within the timeout (NCCL, one rank per GPU where there
# are several, else MPI staged through the one GPU); the doctor names the cause.
gpus=$(nvidia-smi -L | grep -c '^GPU')
np=$gpus; comm=nccl; [ "$gpus" -lt 2 ] && { np=2; comm=mpi; }
if TESSERA_FAULT_ARGS="--backend cuda --comm $comm --layers 2 --d 256 --ctx 8 --tokens 4096" \
     timeout 900 python3 tests/fault/check_faults.py mpirun "$bin/tessera-mlp-lm" "$bin/tessera-doctor" \
     "$bin/fault-divergent" "$np" >"$LOGS/faults.log" 2>&1; then
  log "PASS faults ($comm, $np ranks): $(grep -c '^---' "$LOGS/faults.log") scenarios"
else
  log "FAIL faults ($comm, $np ranks)"; status=1
fi
grep -E '^---|doctor:|tessera: watchdog' "$LOGS/faults.log" | cut -c1-400 | tee -a "$OUT/summary.txt"
