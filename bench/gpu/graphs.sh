# scripts/gpu-check stage graphs (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): (issue 16 item 3) one GPU. Step graphs against eager steps bit for bit: the
# trainer's dumped weights and loss lines with --cuda-graphs on and off (34M bf16 and fp32
# --deterministic with one micro-batch, bf16 --clip 0 with 2 micro-batches, bf16 with the float
# norm clipping (float-clip), a --save-every run that ends the graph mid-way, fsdp2 and ddp), then
# tessera-bench-train's 34M and 1B optim_grads_params steps off / on alternating
# $TESSERA_AB_PAIRS rounds beside PyTorch eager, and compute-sanitizer memcheck over a graph run;
# TESSERA_GRAPH_PARTS="bits speed sanitize" picks parts, TESSERA_GRAPH_BITS="det-bf16 ..." the bits runs.
G=$LOGS/graphs; mkdir -p "$G"
parts=" ${TESSERA_GRAPH_PARTS:-bits speed sanitize} "
t="$bin/tessera-mlp-lm --backend cuda $M34M --tokens 4096 --steps 12 --lr 1e-3 --warmup 4 --log-every 1"
same() {  # same NAME ARGS...: the run with graphs on and off gives the same weights (cmp) and loss lines
  local name=$1; shift
  [[ " ${TESSERA_GRAPH_BITS:-$name} " == *" $name "* ]] || return 0  # TESSERA_GRAPH_BITS="NAME ...": only these
  for mode in on off; do
    $t "$@" --cuda-graphs $mode --dump-weights "$G/$name-$mode.pt" >"$G/$name-$mode.txt" 2>&1 ||
      { log "FAIL graphs $name $mode"; grep -v "^step" "$G/$name-$mode.txt" | tail -25; status=1; return; }
  done
  grep -q 'CUDA graph of' "$G/$name-on.txt" || { log "FAIL graphs $name: no step graph ($(grep -h '^done' "$G/$name-on.txt"))"; status=1; }
  if cmp -s "$G/$name-on.pt" "$G/$name-off.pt" &&
     diff <(grep '^step' "$G/$name-on.txt" | awk '{print $2, $4}') <(grep '^step' "$G/$name-off.txt" | awk '{print $2, $4}') >/dev/null; then
    log "PASS graphs $name: weights byte-identical, $(grep -c '^step' "$G/$name-on.txt") loss lines identical; $(grep -ho 'one CUDA graph of [0-9]* nodes' "$G/$name-on.txt")"
    for mode in on off; do
      log "  $mode: $(grep -ho '[0-9]* tokens/s over\|peak [0-9.]* MiB per rank (library buffers; estimate [0-9.]* MiB' "$G/$name-$mode.txt" | tr '\n' ' ')"
    done
  else
    log "FAIL graphs $name: graph and eager differ"; status=1
    diff <(grep '^step' "$G/$name-on.txt") <(grep '^step' "$G/$name-off.txt") | head -6
  fi
}
if [[ $parts == *" bits "* ]]; then
  same det-bf16 --precision bf16 --deterministic --micro-tokens 4096
  same det-fp32 --precision fp32 --deterministic --micro-tokens 4096
  same clip0-accum2 --precision bf16 --clip 0 --accum 2 --fusion on  # fusion fixed: the timing choice may differ between two runs
  same float-clip --precision bf16 --fusion on  # the float norm (atomics in its sums) clipping at 1
  same save-mid --precision bf16 --deterministic --micro-tokens 4096 --save "$G/ckpt" --save-every 5
  same fsdp2 --precision bf16 --wrapper fsdp2 --deterministic --micro-tokens 4096
  same ddp --precision bf16 --wrapper ddp --strategy no_shard --deterministic --micro-tokens 4096
  # the norms too, where they are exact (--deterministic)
  if diff <(grep '^step' "$G/det-bf16-on.txt" | awk '{print $6}') <(grep '^step' "$G/det-bf16-off.txt" | awk '{print $6}') >/dev/null; then
    log "PASS graphs det-bf16: gradient norms identical"
  else
    log "FAIL graphs det-bf16: gradient norms differ"; status=1
  fi
fi
if [[ $parts == *" speed "* ]]; then
  for spec in "34m $M34M --tokens 4096 --steps 40" "1b $M1B --tokens 8192 --steps 12"; do
    set -- $spec; name=$1; shift
    for i in $(seq 1 "${TESSERA_AB_PAIRS:-3}"); do
      for mode in off on; do
        "$bin/tessera-bench-train" "$@" --strategies optim_grads_params --cuda-graphs $mode \
          --json "$G/$name-$mode-$i.json" >"$G/$name-$mode-$i.txt" 2>&1 || { log "FAIL graphs $name $mode $i"; tail -5 "$G/$name-$mode-$i.txt"; status=1; }
      done
    done
    python3 - "$G" "$name" <<'PY' | tee -a "$OUT/summary.txt"
import glob, json, statistics, sys
d, name = sys.argv[1], sys.argv[2]
med = {}
for side in ('off', 'on'):
  r = [json.load(open(f))['results'][0] for f in sorted(glob.glob(f'{d}/{name}-{side}-*.json'))]
  if not r: continue
  ms = [x['ms'] for x in r]
  med[side] = statistics.median(ms)
  st = [x.get('steady_ms', 0) for x in r]
  med['steady-' + side] = statistics.median(st)
  print(f"== graphs {name} {side}: steady {med['steady-' + side]:.3f} ms {st}; per step waited for: {med[side]:.3f} ms {ms}, host issue {statistics.median([x.get('host_issue_ms', 0) for x in r]):.3f} ms, "
        f"{statistics.median([x['tokens_per_s'] for x in r]):.0f} tokens/s, graph nodes {r[0].get('graph_nodes')}, "
        f"peak {max(x['peak_bytes'] for x in r) / 2**20:.1f} MiB, estimate {r[0].get('estimated_bytes', 0) / 2**20:.1f} MiB")
if 'on' in med and 'off' in med: print(f"== graphs {name}: on/off steady {med['steady-on'] / med['steady-off']:.4f}, waited-for {med['on'] / med['off']:.4f}")
PY
  done
  for mode in on off; do
    $t --precision bf16 --steps 40 --log-every 10 --cuda-graphs $mode >"$G/trainer-34m-$mode.txt" 2>&1 || { log "FAIL graphs trainer $mode"; status=1; }
    log "graphs trainer 34M $mode: $(grep -h '^done' "$G/trainer-34m-$mode.txt")"
  done
  python3 bench/torch_mlp_lm.py $M34M --tokens 4096 --steps 40 --json "$G/torch-34m.json" \
    >"$G/torch-34m.txt" 2>&1 && log "graphs PyTorch eager 34M: $(tail -1 "$G/torch-34m.txt")"
  python3 bench/torch_mlp_lm.py $M1B --tokens 8192 --steps 12 --json "$G/torch-1b.json" \
    >"$G/torch-1b.txt" 2>&1 && log "graphs PyTorch eager 1B: $(tail -1 "$G/torch-1b.txt")"
fi
if [[ $parts == *" sanitize "* ]]; then
  if compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
       $t --precision bf16 --steps 4 --cuda-graphs on >"$G/sanitize.txt" 2>&1; then
    log "PASS graphs sanitize: $(grep -h 'ERROR SUMMARY' "$G/sanitize.txt")"
  else
    log "FAIL graphs sanitize"; grep -v "^step" "$G/sanitize.txt" | head -60; status=1
  fi
fi
tar -czf "$OUT/graphs.tar.gz" -C "$G" .
