# scripts/gpu-check stage ab (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): the optim_grads_params step of $TESSERA_GPU_BIN_BASE/tessera-bench-train
# (a build to compare against, e.g. main before a change) and of this build, alternating,
# $TESSERA_AB_PAIRS pairs (default 3): medians (per step, and steady where the benchmark reports
# it) and their ratio; TESSERA_AB_MODELS="1b 34m" picks models (default 1b), TESSERA_AB_ARGS adds
# flags to both sides (e.g. "--cuda-graphs on"), TESSERA_AB_BASE_ARGS and TESSERA_AB_NEW_ARGS to
# one side each (with only those set, both sides run this build: an A/B of one option),
# TESSERA_AB_TORCH=1 also times PyTorch eager on each model in the same call.
base=${TESSERA_GPU_BIN_BASE:-}
[ -z "$base" ] && [ -n "${TESSERA_AB_BASE_ARGS:-}${TESSERA_AB_NEW_ARGS:-}" ] && base=$bin  # one build, two flag sets
if [ -z "$base" ] || [ ! -x "$base/tessera-bench-train" ]; then
  log "FAIL ab: TESSERA_GPU_BIN_BASE must hold the tessera-bench-train to compare against (or set TESSERA_AB_BASE_ARGS / TESSERA_AB_NEW_ARGS)"; status=1
else
  # At 1 GPU, and at every GPU of the machine (one rank each, NCCL) where it has several.
  gpus=$(nvidia-smi -L | grep -c '^GPU')
  for model in ${TESSERA_AB_MODELS:-1b}; do
    case $model in
      1b) shape="$M1B --steps 20"; tok=8192 ;;
      34m) shape="$M34M --steps 40"; tok=4096 ;;
      *) log "FAIL ab: model '$model' (1b or 34m)"; status=1; continue ;;
    esac
    for np in 1 $([ "$gpus" -ge 2 ] && echo "$gpus"); do
      A=$LOGS/ab-$model-np$np; mkdir -p "$A"
      for i in $(seq 1 "${TESSERA_AB_PAIRS:-3}"); do
        for side in base new; do
          b=$bin; extra=${TESSERA_AB_NEW_ARGS:-}
          [ "$side" = base ] && { b=$base; extra=${TESSERA_AB_BASE_ARGS:-}; }
          mpirun --bind-to none -np "$np" "$b/tessera-bench-train" $shape --tokens $((tok * np)) \
            --strategies optim_grads_params ${TESSERA_AB_ARGS:-} $extra --json "$A/$side-$i.json" >"$A/$side-$i.txt" 2>&1 ||
            { log "FAIL ab $model np$np $side $i"; tail -5 "$A/$side-$i.txt"; status=1; }
        done
      done
      python3 - "$A" "$model" "$np" <<'PY' | tee -a "$OUT/summary.txt"
import glob, json, statistics, sys
r = {s: [json.load(open(f))['results'][0] for f in sorted(glob.glob(f'{sys.argv[1]}/{s}-*.json'))] for s in ('base', 'new')}
for key, what in (('ms', 'per step waited for'), ('steady_ms', 'steady')):
  v = {s: [x.get(key, 0) for x in r[s]] for s in r}
  if not all(v.values()) or not all(all(x > 0 for x in v[s]) for s in v): continue
  b, n = statistics.median(v['base']), statistics.median(v['new'])
  print(f"== ab {sys.argv[2]} optim_grads_params step at {sys.argv[3]} GPU(s), {what}: base {b:.3f} ms {v['base']}, "
        f"new {n:.3f} ms {v['new']}, new/base {n / b:.4f}")
PY
    done
    if [ -n "${TESSERA_AB_TORCH:-}" ]; then  # PyTorch eager at one GPU, in the same call
      python3 bench/torch_mlp_lm.py $shape --tokens $tok --json "$LOGS/ab-$model-torch.json" >"$LOGS/ab-$model-torch.txt" 2>&1 &&
        log "ab $model PyTorch eager: $(tail -1 "$LOGS/ab-$model-torch.txt")"
    fi
  done
fi
