# scripts/gpu-check stage llama (sourced; uses its $bin, $OUT, $LOGS, log, status):
# tessera-llama's CUDA net on one GPU.
#  - curves: the same run on the GPU and on the host backend (fp32, grouped kv
#    heads, an untied head; fsdp at 1 rank and 2 ranks staged through MPI, fsdp2
#    with --recompute): every logged loss within 1e-5 relative; bf16 within 2e-2;
#  - hf: tests/llama/check_hf.py (transformers' LlamaForCausalLM, in: random models
#    it saved, fp32 and bf16, tied and untied; out: the trainer's weights exported);
#  - torch: tests/trainer/compare_torch.py, tessera-llama against bench/torch_llama.py from the
#    same initial weights on the same batches of $TESSERA_GPT_TEXT, fp32 (1e-4 at every step)
#    and bf16 (each curve against PyTorch's fp32 one), $TESSERA_LLAMA_STEPS (50) steps;
#  - speed: each "model:batch" of $TESSERA_LLAMA_SIZES (default llama3.2-1b:4), bf16,
#    seq $TESSERA_LLAMA_SEQ (2048), random tokens, beside bench/torch_llama.py
#    --compile (a plain PyTorch Llama, SDPA with grouped kv heads, fused AdamW) at
#    the same tokens per step in the same call: each one's tokens/s and peak.
#  - profile (not by default): one step of the first size under Nsight Compute, each
#    kernel timed alone, summed by kernel name; torch.compile's last step under
#    torch.profiler beside it (its kernels' table).
# TESSERA_LLAMA_PARTS="curves hf torch speed profile" picks parts.
llama_parts=${TESSERA_LLAMA_PARTS:-curves hf torch speed}
L="$bin/tessera-llama"
if [[ " $llama_parts " == *" curves "* ]]; then
  small="--layers 2 --heads 8 --kv-heads 2 --d 128 --ffn 320 --vocab 512 --seq 64 --batch 4 --steps 12 --log-every 1 --lr 2e-3 --json --text"
  curve() { grep -h '"step"' "$1" | grep -v summary | python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in sys.stdin))'; }
  ok=1
  for case in "1:--wrapper fsdp --strategy optim_grads_params" "2:--wrapper fsdp --strategy optim_grads_params" \
              "1:--wrapper fsdp2 --strategy optim_grads_params --recompute"; do
    np=${case%%:*}; flags=${case#*:}
    timeout 300 mpirun --oversubscribe --bind-to none -np "$np" "$L" --backend cuda --precision fp32 $small $flags \
      --data "$TESSERA_GPT_TEXT" >"$LOGS/llama-cuda-np$np.log" 2>&1
    timeout 300 mpirun --oversubscribe --bind-to none -np "$np" "$L" --backend host --precision fp32 $small $flags \
      --data "$TESSERA_GPT_TEXT" >"$LOGS/llama-host-np$np.log" 2>&1
    worst=$(python3 - "$(curve "$LOGS/llama-cuda-np$np.log")" "$(curve "$LOGS/llama-host-np$np.log")" <<'PY'
import sys
a, b = [list(map(float, s.split())) for s in sys.argv[1:3]]
print(max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a and len(a) == len(b) else 'missing')
PY
)
    log "llama fp32 GPU against host, np$np $flags: worst relative loss difference $worst"
    python3 -c "import sys; sys.exit(0 if '$worst' != 'missing' and float('$worst') < 1e-5 else 1)" || ok=0
  done
  timeout 300 "$L" --backend cuda --precision bf16 $small --data "$TESSERA_GPT_TEXT" >"$LOGS/llama-cuda-bf16.log" 2>&1
  worst=$(python3 - "$(curve "$LOGS/llama-cuda-bf16.log")" "$(curve "$LOGS/llama-host-np1.log")" <<'PY'
import sys
a, b = [list(map(float, s.split())) for s in sys.argv[1:3]]
print(max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a and len(a) == len(b) else 'missing')
PY
)
  log "llama bf16 GPU against fp32 host: worst relative loss difference $worst"
  python3 -c "import sys; sys.exit(0 if '$worst' != 'missing' and float('$worst') < 2e-2 else 1)" || ok=0
  if ((ok)); then log "PASS llama curves"; else log "FAIL llama curves"; status=1; fi
fi
if [[ " $llama_parts " == *" hf "* ]]; then
  if timeout 600 python3 tests/llama/check_hf.py "$L" tools/hf_export.py examples/llama/numpy_forward.py \
      >"$LOGS/llama-hf.log" 2>&1; then
    log "PASS llama hf: $(grep -c '^ok' "$LOGS/llama-hf.log") checks"; grep '^ok\|^FAIL' "$LOGS/llama-hf.log" | tee -a "$OUT/summary.txt"
  else
    log "FAIL llama hf"; tail -20 "$LOGS/llama-hf.log" | tee -a "$OUT/summary.txt"; status=1
  fi
fi
if [[ " $llama_parts " == *" torch "* ]]; then
  torch_curves llama "$L" bench/torch_llama.py "${TESSERA_LLAMA_STEPS:-50}"
fi
if [[ " $llama_parts " == *" speed "* ]]; then
  seq=${TESSERA_LLAMA_SEQ:-2048}
  for size in ${TESSERA_LLAMA_SIZES:-llama3.2-1b:4}; do
    model=${size%%:*}; batch=${size#*:}
    timeout 600 "$L" --backend cuda --precision bf16 --model "$model" --seq "$seq" --batch "$batch" --steps 20 \
      --log-every 5 --json ${TESSERA_LLAMA_FLAGS:-} --text --data "$TESSERA_GPT_TEXT" >"$LOGS/llama-speed-$model.log" 2>&1
    timeout 600 python3 bench/torch_llama.py --model "$model" --seq "$seq" --batch "$batch" --steps 20 --compile \
      >"$LOGS/torch-llama-$model.log" 2>&1
    python3 - "$LOGS/llama-speed-$model.log" "$LOGS/torch-llama-$model.log" "$model" "$batch" "$seq" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
def summary(p):
    try:
        return [json.loads(l) for l in open(p) if l.startswith('{') and '"summary"' in l][-1]
    except (IndexError, OSError, ValueError):
        return None
t, p = summary(sys.argv[1]), summary(sys.argv[2])
name = f'{sys.argv[3]} b{sys.argv[4]} seq {sys.argv[5]} bf16'
if not t:
    print(f'FAIL llama speed {name}: no tessera-llama summary'); sys.exit(0)
line = f'llama speed {name}: tessera-llama {t["tokens_per_s"]:.0f} tok/s ({t["peak_bytes"] / 2**30:.2f} GiB, {t["attention"][:40]})'
if p:
    line += f'; torch.compile {p["tokens_per_s"]:.0f} tok/s ({p["peak_bytes"] / 2**30:.2f} GiB); ratio {t["tokens_per_s"] / p["tokens_per_s"]:.3f}'
else:
    line += '; torch.compile: no summary (see its log)'
print(line)
PY
  done
fi
if [[ " $llama_parts " == *" profile "* ]]; then
  seq=${TESSERA_LLAMA_SEQ:-2048}
  size=${TESSERA_LLAMA_SIZES:-llama3.2-1b:4}; size=${size%% *}; model=${size%%:*}; batch=${size#*:}
  if ncu --nvtx --nvtx-include "tessera-step/" --clock-control none --metrics gpu__time_duration.sum --csv \
       "$L" --backend cuda --precision bf16 --model "$model" --seq "$seq" --batch "$batch" --steps 3 ${TESSERA_LLAMA_FLAGS:-} \
       --text --data "$TESSERA_GPT_TEXT" >"$OUT/llama-profile-$model.csv" 2>"$LOGS/llama-profile-$model.err"; then
    python3 - "$OUT/llama-profile-$model.csv" <<'PY' | tee "$OUT/llama-profile-$model.txt" | tee -a "$OUT/summary.txt"
import collections, csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
        if r.get('Metric Name') == 'gpu__time_duration.sum']
by = collections.defaultdict(lambda: [0.0, 0])
scale = {'nsecond': 1e-6, 'usecond': 1e-3, 'msecond': 1.0, 'second': 1e3}
for r in rows:
    ms = float(r['Metric Value'].replace(',', '')) * scale.get(r['Metric Unit'], 1e-6)
    k = by[r['Kernel Name'][:110]]
    k[0] += ms; k[1] += 1
total = sum(v[0] for v in by.values())
print(f'llama profile: {len(rows)} kernels, {total:.2f} ms of kernels (each timed alone)')
for name, (ms, n) in sorted(by.items(), key=lambda x: -x[1][0])[:30]:
    print(f'  {ms:9.3f} ms {100 * ms / total:5.1f}% x{n:<4d} {name}')
PY
  else
    log "FAIL llama profile"; tail -5 "$LOGS/llama-profile-$model.err"; status=1
  fi
  timeout 600 python3 bench/torch_llama.py --model "$model" --seq "$seq" --batch "$batch" --steps 8 --compile \
    --profile "$OUT/torch-llama-profile-$model.txt" >"$LOGS/torch-llama-profile-$model.log" 2>&1 &&
    head -45 "$OUT/torch-llama-profile-$model.txt" | tee -a "$OUT/summary.txt" || { log "FAIL torch llama profile"; status=1; }
fi
