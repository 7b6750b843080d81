# scripts/gpu-check stage gpt (sourced; uses its $bin, $OUT, $LOGS, log, status):
# tessera-gpt's CUDA net on one GPU.
#  - correctness: tests/gpt/cuda_curves.sh (fp32 GPU = host under sharded
#    strategies, bf16 within tolerance, numpy float64 forward of the GPU's
#    weights, the loss falls on real text);
#  - against PyTorch (bench/torch_gpt2.py) from the same initial weights on
#    the same batches: the first $TESSERA_GPT_STEPS (50) losses, fp32 and bf16;
#  - the way out: tools/export_hf_gpt2.py's directory loads in transformers'
#    GPT2LMHeadModel and gives the trainer's validation loss (tests/gpt/check_hf.py);
#  - where it stands: GPT-2 124M, bf16, batch $TESSERA_GPT_BATCH (8) x 1024,
#    beside PyTorch eager (SDPA) in the same call.
# Text: $TESSERA_GPT_TEXT, a plain-text English file (the machine has no
# fortunes package: carry one).
# TESSERA_GPT_PARTS="curves torch hf speed" picks parts.
gpt_text=${TESSERA_GPT_TEXT:-}
gpt_parts=${TESSERA_GPT_PARTS:-curves torch hf speed}
if [ -z "$gpt_text" ] || [ ! -f "$gpt_text" ]; then
  log "FAIL gpt: TESSERA_GPT_TEXT names no file"; status=1
else
  if [[ " $gpt_parts " == *" curves "* ]]; then
    if bash tests/gpt/cuda_curves.sh "$bin/tessera-gpt" mpirun "$gpt_text" >"$LOGS/gpt-curves.log" 2>&1; then
      log "PASS gpt curves"
    else
      log "FAIL gpt curves"; status=1
    fi
    grep -E '^--|^worst|^GPU|^step|^sample|^done|FAIL' "$LOGS/gpt-curves.log" | tee -a "$OUT/summary.txt"
  fi
  if [[ " $gpt_parts " == *" torch "* ]]; then
    for prec in fp32 bf16; do
      if python3 tests/gpt/compare_torch.py "$bin/tessera-gpt" bench/torch_gpt2.py "$gpt_text" $prec \
           "${TESSERA_GPT_STEPS:-50}" >"$LOGS/gpt-torch-$prec.log" 2>&1; then
        log "PASS gpt = torch ($prec): $(tail -1 "$LOGS/gpt-torch-$prec.log")"
      else
        log "FAIL gpt = torch ($prec)"; tail -20 "$LOGS/gpt-torch-$prec.log"; status=1
      fi
      grep -E '^step' "$LOGS/gpt-torch-$prec.log" >>"$OUT/summary.txt"
    done
  fi
  if [[ " $gpt_parts " == *" hf "* ]]; then
    if python3 tests/gpt/check_hf.py "$bin/tessera-gpt" tools/export_hf_gpt2.py "$gpt_text" >"$LOGS/gpt-hf.log" 2>&1; then
      log "PASS gpt -> Hugging Face: $(tail -1 "$LOGS/gpt-hf.log")"
    else
      log "FAIL gpt -> Hugging Face"; tail -20 "$LOGS/gpt-hf.log"; status=1
    fi
  fi
  if [[ " $gpt_parts " == *" speed "* ]]; then
    b=${TESSERA_GPT_BATCH:-8}
    log "gpt2 124M, bf16, batch $b x 1024: tessera-gpt (one rank) beside PyTorch eager (SDPA)"
    timeout 300 "$bin/tessera-gpt" --backend cuda --model gpt2 --precision bf16 --batch $b --steps 8 --log-every 1 \
      --data "$gpt_text" --text --json >"$OUT/gpt-124m-tessera.json" 2>"$LOGS/gpt-124m-tessera.err" || status=1
    timeout 300 python3 bench/torch_gpt2.py --model gpt2 --precision bf16 --batch $b --seq 1024 --steps 12 \
      >"$OUT/gpt-124m-torch.json" 2>"$LOGS/gpt-124m-torch.err" || status=1
    python3 - "$OUT/gpt-124m-tessera.json" "$OUT/gpt-124m-torch.json" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
def summary(p):
    rows = [json.loads(l) for l in open(p) if l.startswith('{')]
    return [r for r in rows if r.get('summary')][-1] if any(r.get('summary') for r in rows) else {}
t, p = summary(sys.argv[1]), summary(sys.argv[2])
tt, pt = t.get('tokens_per_s', 0), p.get('tokens_per_s', 0)
print(f"tessera-gpt {tt:.0f} tokens/s, peak {t.get('peak_bytes', 0) / 2**30:.2f} GiB (library buffers); "
      f"PyTorch eager {pt:.0f} tokens/s, peak {p.get('peak_bytes', 0) / 2**30:.2f} GiB; ratio {tt / pt if pt else 0:.3f}")
PY
  fi
fi
