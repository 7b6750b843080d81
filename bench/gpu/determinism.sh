# scripts/gpu-check stage determinism (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): (issue 18) tests/trainer/check_determinism.py on the GPU trainer (fp32 and
# bf16: every strategy x wrapper at 1 rank (NCCL) and 2-4 ranks, one per GPU where there are
# enough, else staged MPI; byte-identical dumps), then its cost at 1B: the trainer's step
# default beside --deterministic at one GPU and at all of them, one micro-batch per rank and four;
# TESSERA_DET_PARTS="bits cost" picks parts; TESSERA_DET_SPECS="label:flags;..." the cost runs
# (a label base-* runs $TESSERA_GPU_BIN_BASE's trainer: an A/B of two builds).
dparts=${TESSERA_DET_PARTS:-bits cost}
if [[ " $dparts " == *" bits "* ]]; then
  for prec in fp32 bf16; do
    if TESSERA_DET_WORLDS="${TESSERA_DET_WORLDS:-1 2 3 4}" python3 tests/trainer/check_determinism.py mpirun \
         "$bin/tessera-mlp-lm" "$prec" --backend cuda >"$LOGS/determinism-$prec.log" 2>&1; then
      log "PASS determinism (cuda, $prec): $(grep -c '^ok' "$LOGS/determinism-$prec.log") checks"
    else
      log "FAIL determinism (cuda, $prec)"; tail -20 "$LOGS/determinism-$prec.log"; status=1
    fi
    grep -E '^(ok|FAIL|reference)' "$LOGS/determinism-$prec.log" >>"$OUT/determinism.txt"
  done
fi
if [[ " $dparts " == *" cost "* ]]; then
  gpus=$(nvidia-smi -L | grep -c '^GPU')
  big="--backend cuda --precision bf16 $M1B --steps 20 --log-every 5 --lr 1e-4 --warmup 10 --json"
  specs=${TESSERA_DET_SPECS:-default:;exact-1mb:--deterministic --micro-tokens 8192;default-4mb:--accum 4;exact-4mb:--deterministic --micro-tokens 2048;default:;exact-1mb:--deterministic --micro-tokens 8192}
  for np in 1 $([ "$gpus" -gt 1 ] && echo "$gpus"); do
    t=$((8192 * np))
    IFS=';' read -ra speclist <<<"$specs"
    for spec in "${speclist[@]}"; do
      label=${spec%%:*}; flags=${spec#*:}
      b=$bin; [[ $label == base-* ]] && b=${TESSERA_GPU_BIN_BASE:?a base- label needs TESSERA_GPU_BIN_BASE}
      mpirun --bind-to none -np "$np" "$b/tessera-mlp-lm" $big --tokens "$t" --strategy optim_grads_params $flags 2>&1 |
        grep '^{' | sed "s/^/np$np $label /" >>"$OUT/determinism-cost.txt" || status=1
      grep "^np$np $label .*summary" "$OUT/determinism-cost.txt" | tail -1
    done
  done
fi
