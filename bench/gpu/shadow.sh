# scripts/gpu-check stage shadow (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): (issue 16) one GPU, the optimizer in the next forward's shadow. The 1B and 34M
# optim_grads_params steps of $TESSERA_GPU_BIN_BASE/tessera-bench-train (the build before it),
# this build with --overlap-updates off and on, alternating $TESSERA_AB_PAIRS rounds (default 3):
# medians and ratios; then the trainer at 1B (on, off) beside PyTorch eager in the same call.
S=$LOGS/shadow; mkdir -p "$S"
base=${TESSERA_GPU_BIN_BASE:-}
for spec in "1b $M1B --tokens 8192 --steps 20" "34m $M34M --tokens 4096 --steps 40"; do
  set -- $spec; name=$1; shift
  for i in $(seq 1 "${TESSERA_AB_PAIRS:-3}"); do
    if [ -n "$base" ] && [ -x "$base/tessera-bench-train" ]; then
      "$base/tessera-bench-train" "$@" --strategies optim_grads_params --json "$S/$name-base-$i.json" >"$S/$name-base-$i.txt" 2>&1 ||
        { log "FAIL shadow $name base $i"; status=1; }
    fi
    for mode in off on; do
      "$bin/tessera-bench-train" "$@" --strategies optim_grads_params --overlap-updates $mode \
        --json "$S/$name-$mode-$i.json" >"$S/$name-$mode-$i.txt" 2>&1 || { log "FAIL shadow $name $mode $i"; status=1; }
    done
  done
  python3 - "$S" "$name" <<'PY' | tee -a "$OUT/summary.txt"
import glob, json, statistics, sys
d, name = sys.argv[1], sys.argv[2]
def runs(side):
  return [json.load(open(f))['results'][0] for f in sorted(glob.glob(f'{d}/{name}-{side}-*.json'))]
med = {}
for side in ('base', 'off', 'on'):
  r = runs(side)
  if not r: continue
  ms = [x['ms'] for x in r]
  med[side] = statistics.median(ms)
  print(f"== shadow {name} {side}: step {med[side]:.3f} ms {ms}, compute {statistics.median([x['compute_ms'] for x in r]):.3f} ms, "
        f"optimizer phase {statistics.median([x['optimizer_ms'] for x in r]):.3f} ms, "
        f"host issue {statistics.median([x.get('host_issue_ms', 0) for x in r]):.3f} ms, "
        f"{statistics.median([x['tokens_per_s'] for x in r]):.0f} tokens/s, peak {max(x['peak_bytes'] for x in r) / 2**20:.1f} MiB")
if 'on' in med and 'off' in med: print(f"== shadow {name}: on/off {med['on'] / med['off']:.4f}")
if 'on' in med and 'base' in med: print(f"== shadow {name}: on/base {med['on'] / med['base']:.4f}, off/base {med['off'] / med['base']:.4f}")
PY
done
# The trainer itself at 1B (its own tokens/s over the steps after the first) and PyTorch eager, same call.
for mode in on off; do
  "$bin/tessera-mlp-lm" --backend cuda --precision bf16 $M1B --tokens 8192 --steps 30 \
    --lr 1e-4 --warmup 10 --log-every 10 --overlap-updates $mode >"$S/trainer-1b-$mode.txt" 2>&1 || { log "FAIL shadow trainer $mode"; status=1; }
  log "shadow trainer 1B overlap $mode: $(grep '^done' "$S/trainer-1b-$mode.txt")"
done
python3 bench/torch_mlp_lm.py $M1B --tokens 8192 --steps 20 --json "$S/torch-1b.json" \
  >"$S/torch-1b.txt" 2>&1 && log "shadow PyTorch eager 1B: $(tail -1 "$S/torch-1b.txt")"
python3 bench/torch_mlp_lm.py $M34M --tokens 4096 --steps 40 --json "$S/torch-34m.json" \
  >"$S/torch-34m.txt" 2>&1 && log "shadow PyTorch eager 34M: $(tail -1 "$S/torch-34m.txt")"
tar -czf "$OUT/shadow.tar.gz" -C "$S" .  # at most 8 files come back from the device tool
