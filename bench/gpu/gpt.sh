# scripts/gpu-check stage gpt (sourced; uses its $bin, $OUT, $LOGS, log, status):
# tessera-gpt's CUDA net on one GPU.
#  - correctness: tests/gpt/cuda_curves.sh (fp32 GPU = host under sharded
#    strategies, bf16 within tolerance, numpy float64 forward of the GPU's
#    weights, the loss falls on real text);
#  - against PyTorch (bench/torch_gpt2.py) from the same initial weights on
#    the same batches: the first $TESSERA_GPT_STEPS (50) losses, fp32 and bf16;
#  - the way out: tools/hf_export.py's directory loads in transformers'
#    GPT2LMHeadModel and gives the trainer's validation loss (tests/gpt/check_hf.py);
#  - kernels: tests/cuda/test_gpt_kernels_cuda.cu (attention, LayerNorm,
#    cross-entropy, embeddings against float64);
#  - speed: each "model:batch" of $TESSERA_GPT_SIZES (default gpt2:8), bf16,
#    seq 1024, beside PyTorch eager (SDPA; TESSERA_GPT_EAGER=0 leaves it out) and,
#    with TESSERA_GPT_COMPILE=1, torch.compile in the same call (bench/gpt_speed_summary.py prints the
#    ratios), and with TESSERA_GPT_LLMC=PATH llm.c's train_gpt2cu (bench/llmc_gpt2.py);
#    $TESSERA_GPT_FLAGS adds trainer flags (e.g. --recompute), and
#    $TESSERA_GPT_ALSO runs tessera-gpt again with more (e.g. --attention flash) as a row;
#  - variants: $TESSERA_GPT_VARIANT (gpt2:32) at one rank under fsdp and fsdp2
#    (optim_grads_params), fsdp and ddp (no_shard), and --recompute, beside
#    torch.compile in the same call;
#  - profile: the last step of $TESSERA_GPT_PROFILE (gpt2:8) under ncu, every
#    kernel alone, summed by class with its DRAM bytes against the device copy
#    and the schedule's floor (bench/ncu_step_summary.py), the products in their
#    fused forms (TESSERA_PRODUCT_FORMS=fused);
#  - learn: GPT-2 124M's shape over bytes trained on $TESSERA_GPT_PROSE/prose-train.txt
#    (bench/gpu/make_prose.sh makes it, 13 MB) for $TESSERA_GPT_LEARN_STEPS (1200)
#    steps, the held-out prose-val.txt every 50 steps; the validation loss must
#    fall well below the text's unigram entropy (bench/plot_gpt_learning.py, a PNG).
# Text: $TESSERA_GPT_TEXT, a plain-text English file (the machine has no
# fortunes package: carry one).
#  - multi: GPT-2 at every GPU of the machine beside PyTorch FSDP2 (issue 39's part; a dry run at one).
#  - determinism: tests/trainer/check_determinism.py on the GPU (--deterministic: the same bits
#    at any world size, strategy and wrapper; fp32 on the exact attention, bf16 on cuDNN's
#    deterministic backward, bf16 at head dimension 64 with --attention flash; worlds
#    $TESSERA_GPT_DET_WORLDS, default "1 2 3"), then its cost at $TESSERA_GPT_DET_SIZE (gpt2:8)
#    beside the default path in the same call;
#  - ab: $TESSERA_GPU_BIN_BASE/tessera-gpt (a build to compare against; default this one) and
#    this build's, alternating, $TESSERA_GPT_AB_PAIRS pairs (2) at each $TESSERA_GPT_SIZES, the base
#    side under the environment $TESSERA_GPT_AB_BASE_ENV (e.g. TESSERA_MATMUL_CANDIDATES=1) and
#    with the flags $TESSERA_GPT_AB_BASE_FLAGS (e.g. --cuda-graphs off), the new side with
#    $TESSERA_GPT_AB_NEW_FLAGS (e.g. --keep-gelu: a flag against the same build): each
#    side's median tokens/s, their ratio, and both sides' first and last losses (the same
#    arithmetic should give nearly the same);
#  - init: initial weights drawn on the device equal at 1, 2 and 3 ranks, and the host's;
#    tessera-bench-init: each init_param call's time against its draws alone (1.5B).
#  - graphs: step graphs against eager steps bit for bit (--cuda-graphs on and off, --deterministic,
#    one micro-batch: the dumped weights and the loss lines; bf16 on cuDNN, fp32 on the exact
#    attention, and a bf16 run that validates and saves mid-way, which ends the graph twice); the
#    graph's token slots in the memory count (124M, --accum 3: estimate = tessera-plan = peak; needs
#    tessera-plan beside tessera-gpt in $bin); their speed is the ab part with TESSERA_GPT_AB_BASE_FLAGS="--cuda-graphs off".
# TESSERA_GPT_PARTS="kernels curves torch hf init determinism graphs speed ab variants profile learn multi" picks parts.
gpt_text=${TESSERA_GPT_TEXT:-}
gpt_parts=${TESSERA_GPT_PARTS:-kernels curves torch hf speed}
if [ -z "$gpt_text" ] || [ ! -f "$gpt_text" ]; then
  log "FAIL gpt: TESSERA_GPT_TEXT names no file"; status=1
else
  if [[ " $gpt_parts " == *" kernels "* ]]; then
    if "$bin/test-gpt-kernels-cuda" >"$LOGS/gpt-kernels.log" 2>&1; then
      log "PASS gpt kernels vs float64"
    else
      log "FAIL gpt kernels vs float64"; tail -20 "$LOGS/gpt-kernels.log"; status=1
    fi
    grep -E '^attention' "$LOGS/gpt-kernels.log" | tee -a "$OUT/summary.txt"
  fi
  if [[ " $gpt_parts " == *" curves "* ]]; then
    if bash tests/gpt/cuda_curves.sh "$bin/tessera-gpt" mpirun "$gpt_text" >"$LOGS/gpt-curves.log" 2>&1; then
      log "PASS gpt curves"
    else
      log "FAIL gpt curves"; status=1
    fi
    grep -E '^--|^worst|^GPU|^step|^sample|^done|FAIL' "$LOGS/gpt-curves.log" | tee -a "$OUT/summary.txt"
  fi
  if [[ " $gpt_parts " == *" torch "* ]]; then
    torch_curves gpt "$bin/tessera-gpt" bench/torch_gpt2.py "${TESSERA_GPT_STEPS:-50}"
    # TESSERA_GPT_ALSO (e.g. "--attention flash"): the bf16 comparison again with those flags, same data.
    if [ -n "${TESSERA_GPT_ALSO:-}" ]; then
      if python3 tests/trainer/compare_torch.py "$bin/tessera-gpt" bench/torch_gpt2.py "$gpt_text" bf16 \
           "${TESSERA_GPT_STEPS:-50}" $TESSERA_GPT_ALSO >"$LOGS/gpt-torch-bf16-also.log" 2>&1; then
        log "PASS gpt = torch (bf16, $TESSERA_GPT_ALSO): $(tail -1 "$LOGS/gpt-torch-bf16-also.log")"
      else
        log "FAIL gpt = torch (bf16, $TESSERA_GPT_ALSO): $(tail -1 "$LOGS/gpt-torch-bf16-also.log")"; status=1
      fi
    fi
  fi
  if [[ " $gpt_parts " == *" hf "* ]]; then
    if python3 tests/gpt/check_hf.py "$bin/tessera-gpt" tools/hf_export.py "$gpt_text" >"$LOGS/gpt-hf.log" 2>&1; then
      log "PASS gpt -> Hugging Face: $(tail -1 "$LOGS/gpt-hf.log")"
    else
      log "FAIL gpt -> Hugging Face"; tail -20 "$LOGS/gpt-hf.log"; status=1
    fi
  fi
  if [[ " $gpt_parts " == *" init "* ]]; then
    # Initial weights drawn on the device (the library's init_param): the suite's cases at 1 and 2
    # staged ranks, then GPT-2 124M's weights at 1, 2 and 3 ranks (optim_grads_params: each rank
    # draws its shard) byte for byte, and against the host backend's draws (tests/gpt/compare_dumps.py).
    filter='--run_test=init_param_on_the_device_is_the_hosts*:device_normals_round_like_the_hosts'
    run_np init-suite-np1 1 "$bin/test-strategies-cuda" "$filter"
    run_np init-suite-np2 2 "$bin/test-strategies-cuda" "$filter"
    grep -h 'floats differ' "$LOGS/init-suite-np1.log" | head -1 | tee -a "$OUT/summary.txt"
    dump="$OUT/init" && mkdir -p "$dump"
    for np in 1 2 3; do
      timeout 300 mpirun --oversubscribe --bind-to none -np $np "$bin/tessera-gpt" --backend cuda --model gpt2 \
        --precision fp32 --steps 0 --data "$gpt_text" --text --dump-weights "$dump/cuda-np$np.safetensors" --json \
        >"$LOGS/gpt-init-cuda-np$np.log" 2>&1 || status=1
    done
    timeout 300 "$bin/tessera-gpt" --backend host --model gpt2 --precision fp32 --steps 0 --data "$gpt_text" --text \
      --dump-weights "$dump/host.safetensors" --json >"$LOGS/gpt-init-host.log" 2>&1 || status=1
    for np in 2 3; do
      if python3 tests/gpt/compare_dumps.py "$dump/cuda-np1.safetensors" "$dump/cuda-np$np.safetensors" 0 0 \
           >"$LOGS/gpt-init-np$np.txt" 2>&1; then log "PASS gpt init, cuda np1 = np$np: $(tail -1 "$LOGS/gpt-init-np$np.txt")"
      else log "FAIL gpt init, cuda np1 = np$np: $(tail -1 "$LOGS/gpt-init-np$np.txt")"; status=1; fi
    done
    if python3 tests/gpt/compare_dumps.py "$dump/host.safetensors" "$dump/cuda-np1.safetensors" 64 1 \
         >"$LOGS/gpt-init-host.txt" 2>&1; then log "PASS gpt init, cuda = host: $(tail -1 "$LOGS/gpt-init-host.txt")"
    else log "FAIL gpt init, cuda = host: $(tail -1 "$LOGS/gpt-init-host.txt")"; status=1; fi
    # Where init_model's seconds go: each init_param call against the same draws alone, twice
    # (the first pass pays kernel loading), at 1.5B; again with every kernel loaded up front.
    if [ -x "$bin/tessera-bench-init" ]; then
      "$bin/tessera-bench-init" --model gpt2-xl --json "$OUT/gpt-init-bench.json" 2>&1 | tee -a "$OUT/summary.txt" || status=1
      CUDA_MODULE_LOADING=EAGER "$bin/tessera-bench-init" --model gpt2-xl --passes 1 2>&1 | sed 's/^/EAGER loading: /' \
        | tee -a "$OUT/summary.txt" || status=1
    else log "SKIP tessera-bench-init: not in $bin"; fi
    grep -ho '"init_s":[0-9.]*' "$LOGS"/gpt-init-*.log | tr '\n' ' ' | sed 's/^/init seconds (cuda np1 np2 np3, host): /' | tee -a "$OUT/summary.txt"
    echo | tee -a "$OUT/summary.txt"
    rm -rf "$dump"
  fi
  if [[ " $gpt_parts " == *" determinism "* ]]; then
    worlds=${TESSERA_GPT_DET_WORLDS:-1 2 3}
    for spec in "fp32:" "bf16:" "bf16:--attention flash"; do
      prec=${spec%%:*} flags=${spec#*:} tag=$prec${flags:+-flash}
      shape=()  # check_determinism.py's own shape, or head dimension 64 where flash runs
      [ -n "$flags" ] && shape=(TESSERA_DET_GPT_SHAPE="--layers 2 --heads 2 --d 128 --seq 80")
      if env "${shape[@]}" TESSERA_DET_WORLDS="$worlds" \
           timeout 400 python3 tests/trainer/check_determinism.py mpirun "$bin/tessera-gpt" "$prec" --backend cuda $flags \
           --data "$(realpath "$gpt_text")" --text \
           >"$LOGS/gpt-determinism-$tag.log" 2>&1; then
        log "PASS gpt determinism (cuda, $prec $flags): $(grep -c '^ok' "$LOGS/gpt-determinism-$tag.log") checks"
      else
        log "FAIL gpt determinism (cuda, $prec $flags)"; tail -20 "$LOGS/gpt-determinism-$tag.log"; status=1
      fi
      grep -E '^(ok|FAIL|reference)' "$LOGS/gpt-determinism-$tag.log" | sed "s/^/$tag /" >>"$OUT/gpt-determinism.txt"
    done
    # What --deterministic costs: the same model and batch, default then deterministic (one micro-batch a step).
    spec=${TESSERA_GPT_DET_SIZE:-gpt2:8}
    model=${spec%%:*} b=${spec##*:}
    for v in default deterministic; do
      timeout 300 "$bin/tessera-gpt" --backend cuda --model $model --precision bf16 --batch $b --steps 12 --log-every 1 \
        --json --data "$gpt_text" --text $([ $v = deterministic ] && echo --deterministic) \
        >"$OUT/gpt-det-$model-$v.json" 2>"$LOGS/gpt-det-$model-$v.err" || status=1
    done
    python3 bench/gpt_speed_summary.py "$OUT/gpt-det-$model-deterministic.json" "$OUT/gpt-det-$model-default.json" \
      | tee -a "$OUT/summary.txt"
  fi
  if [[ " $gpt_parts " == *" speed "* ]]; then
    # Each size at its batch, tessera-gpt then PyTorch eager and (TESSERA_GPT_COMPILE=1) torch.compile,
    # in this one call. PyTorch draws random tokens (the speed issue's setting); tessera-gpt reads
    # the text as bytes (it has no random-token source), which does not change the work per token.
    for spec in ${TESSERA_GPT_SIZES:-gpt2:8}; do
      model=${spec%%:*} b=${spec##*:}
      log "$model, bf16, batch $b x 1024: tessera-gpt (one rank) beside PyTorch (SDPA) ${TESSERA_GPT_FLAGS:-}"
      timeout 300 "$bin/tessera-gpt" --backend cuda --model $model --precision bf16 --batch $b --steps ${TESSERA_GPT_SPEED_STEPS:-12} \
        --log-every 1 --json --data "$gpt_text" --text ${TESSERA_GPT_FLAGS:-} >"$OUT/gpt-$model-b$b-tessera.json" 2>"$LOGS/gpt-$model-b$b-tessera.err" || status=1
      peers=
      if [ "${TESSERA_GPT_EAGER:-1}" = 1 ]; then  # TESSERA_GPT_EAGER=0: torch.compile alone (eager is slower)
        timeout 300 python3 bench/torch_gpt2.py --model $model --precision bf16 --batch $b --seq 1024 --steps 12 \
          >"$OUT/gpt-$model-b$b-torch.json" 2>"$LOGS/gpt-$model-b$b-torch.err" || status=1
        peers="$OUT/gpt-$model-b$b-torch.json"
      fi
      # TESSERA_GPT_ALSO: tessera-gpt once more with these flags (e.g. "--attention flash"), as a peer row.
      if [ -n "${TESSERA_GPT_ALSO:-}" ]; then
        timeout 300 "$bin/tessera-gpt" --backend cuda --model $model --precision bf16 --batch $b --steps ${TESSERA_GPT_SPEED_STEPS:-12} \
          --log-every 1 --json --data "$gpt_text" --text ${TESSERA_GPT_FLAGS:-} $TESSERA_GPT_ALSO \
          >"$OUT/gpt-$model-b$b-also.json" 2>"$LOGS/gpt-$model-b$b-also.err" || status=1
        peers="$peers $OUT/gpt-$model-b$b-also.json"
      fi
      if [ "${TESSERA_GPT_COMPILE:-0}" = 1 ]; then
        timeout 400 python3 bench/torch_gpt2.py --model $model --precision bf16 --batch $b --seq 1024 --steps 30 --compile \
          >"$OUT/gpt-$model-b$b-compile.json" 2>"$LOGS/gpt-$model-b$b-compile.err" || status=1
        peers="$peers $OUT/gpt-$model-b$b-compile.json"
      fi
      # TESSERA_GPT_LLMC: an llm.c train_gpt2cu built elsewhere (bench/llmc_gpt2.py says how), the other peer.
      if [ -n "${TESSERA_GPT_LLMC:-}" ]; then
        timeout 300 python3 bench/llmc_gpt2.py --llmc "$TESSERA_GPT_LLMC" --model $model --batch $b --seq 1024 --steps 30 \
          >"$OUT/gpt-$model-b$b-llmc.json" 2>"$LOGS/gpt-$model-b$b-llmc.err" || status=1
        peers="$peers $OUT/gpt-$model-b$b-llmc.json"
      fi
      python3 bench/gpt_speed_summary.py "$OUT/gpt-$model-b$b-tessera.json" $peers | tee -a "$OUT/summary.txt"
    done
  fi
  if [[ " $gpt_parts " == *" graphs "* ]]; then
    G=$LOGS/gpt-graphs; mkdir -p "$G"
    small="--layers 4 --heads 4 --d 256 --seq 256 --batch 4 --steps 12 --lr 1e-3 --warmup 3 --log-every 1"
    for spec in "det-bf16:--precision bf16" "det-fp32:--precision fp32" \
                "det-bf16-val-save:--precision bf16 --val-data $gpt_text --val-every 4 --save $G/ckpt --save-every 5"; do
      name=${spec%%:*} flags=${spec#*:}
      for mode in on off; do
        rm -rf "$G/ckpt"
        timeout 300 "$bin/tessera-gpt" --backend cuda $small --deterministic --data "$gpt_text" --text $flags \
          --cuda-graphs $mode --dump-weights "$G/$name-$mode.pt" >"$G/$name-$mode.txt" 2>&1 ||
          { log "FAIL gpt graphs $name $mode"; tail -5 "$G/$name-$mode.txt"; status=1; }
      done
      for mode in on off; do  # the loss lines without their times
        grep '^step' "$G/$name-$mode.txt" | sed -E 's/ +[0-9.]+ ms +[0-9]+ tokens\/s//' >"$G/$name-$mode.loss"
      done
      if ! grep -q 'one CUDA graph of' "$G/$name-on.txt"; then
        log "FAIL gpt graphs $name: no step graph ($(grep -h '^done' "$G/$name-on.txt"))"; status=1
      elif cmp -s "$G/$name-on.pt" "$G/$name-off.pt" && cmp -s "$G/$name-on.loss" "$G/$name-off.loss"; then
        log "PASS gpt graphs $name: weights byte-identical, $(wc -l <"$G/$name-on.loss") loss lines identical; $(grep -ho 'one CUDA graph of [0-9]* nodes' "$G/$name-on.txt")"
      else
        log "FAIL gpt graphs $name: graph and eager differ (weights: $(cmp -s "$G/$name-on.pt" "$G/$name-off.pt" && echo same || echo differ))"
        status=1
        diff "$G/$name-on.loss" "$G/$name-off.loss" | head -8
      fi
    done
    # The graph's token slots in the count: GPT-2 124M, batch 4, --accum 3, graphs on. The trainer's
    # estimate must equal the planner's (tessera-plan --cuda-graphs on, plus cuDNN's attention
    # workspace, which only the run knows) and the measured peak.
    if [ -x "$bin/tessera-plan" ]; then
      slot_flags="--model gpt2 --batch 4 --accum 3 --precision bf16"
      timeout 300 "$bin/tessera-gpt" --backend cuda $slot_flags --cuda-graphs on --steps 4 --json --data "$gpt_text" --text \
        >"$G/slots.json" 2>"$G/slots.err" &&
        "$bin/tessera-plan" memory --gpus 1 --backend cuda $slot_flags --cuda-graphs on --json >"$G/slots-plan.json" 2>>"$G/slots.err"
      if python3 - "$G/slots.json" "$G/slots-plan.json" <<'PY' 2>>"$G/slots.err" | tee -a "$OUT/summary.txt"; then :; else log "FAIL gpt graphs slots: $(tail -3 "$G/slots.err")"; status=1; fi
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][-1]
p = json.load(open(sys.argv[2]))
planned = p['total_bytes'] + s.get('attention_workspace_bytes', 0)
ok = s['cuda_graphs'] and s['estimated_bytes'] == planned == s['peak_bytes']
print(f"{'PASS' if ok else 'FAIL'} gpt graphs slots (124M, batch 4, --accum 3, graphs on): estimate {s['estimated_bytes']} B, "
      f"planner + attention workspace {planned} B, peak {s['peak_bytes']} B")
sys.exit(0 if ok else 1)
PY
    fi
  fi
  if [[ " $gpt_parts " == *" ab "* ]]; then
    base_bin=${TESSERA_GPU_BIN_BASE:-$bin}
    for spec in ${TESSERA_GPT_SIZES:-gpt2:8}; do
      model=${spec%%:*} b=${spec##*:}
      for i in $(seq 1 "${TESSERA_GPT_AB_PAIRS:-2}"); do
        for side in base new; do
          exe=$bin/tessera-gpt envs=() flags=()
          [ $side = new ] && read -r -a flags <<<"${TESSERA_GPT_AB_NEW_FLAGS:-}"
          [ $side = base ] && { exe=$base_bin/tessera-gpt; read -r -a envs <<<"${TESSERA_GPT_AB_BASE_ENV:-}";
                                read -r -a flags <<<"${TESSERA_GPT_AB_BASE_FLAGS:-}"; }
          timeout 300 env "${envs[@]}" "$exe" --backend cuda --model $model --precision bf16 --batch $b --steps 14 \
            --log-every 1 --json --data "$gpt_text" --text ${TESSERA_GPT_FLAGS:-} "${flags[@]}" \
            >"$OUT/gpt-ab-$model-b$b-$side-$i.json" 2>"$LOGS/gpt-ab-$model-b$b-$side-$i.err" ||
            { log "FAIL gpt ab $model $side $i"; tail -3 "$LOGS/gpt-ab-$model-b$b-$side-$i.err"; status=1; }
        done
      done
      python3 - "$OUT" "$model" "$b" <<'PY' | tee -a "$OUT/summary.txt"
import glob, json, statistics, sys
out, model, b = sys.argv[1:4]
row = {}
for side in ('base', 'new'):
    tps, loss = [], None
    for f in sorted(glob.glob(f'{out}/gpt-ab-{model}-b{b}-{side}-*.json')):
        lines = [json.loads(l) for l in open(f) if l.startswith('{')]
        tps += [l['tokens_per_s'] for l in lines if l.get('summary')]
        steps = [l for l in lines if 'loss' in l and not l.get('summary')]
        loss = loss or (steps[0]['loss'], steps[-1]['loss'])
    row[side] = (statistics.median(tps) if tps else 0, tps, loss)
(bt, bl, bloss), (nt, nl, nloss) = row['base'], row['new']
print(f"== gpt ab {model} batch {b}: base {bt:,.0f} tokens/s {[round(x) for x in bl]}, new {nt:,.0f} "
      f"{[round(x) for x in nl]}, new/base {nt / bt if bt else 0:.3f}; losses (first, last) base {bloss} new {nloss}")
PY
    done
  fi
  if [[ " $gpt_parts " == *" variants "* ]]; then
    # What the wrapper and strategy cost at one rank (sharding must cost nothing at N = 1) and what
    # --recompute costs and saves: $TESSERA_GPT_VARIANT (gpt2:32) under each, beside torch.compile.
    spec=${TESSERA_GPT_VARIANT:-gpt2:32}
    model=${spec%%:*} b=${spec##*:}
    timeout 400 python3 bench/torch_gpt2.py --model $model --precision bf16 --batch $b --seq 1024 --steps 30 --compile \
      >"$OUT/gpt-variants-compile.json" 2>"$LOGS/gpt-variants-compile.err" || status=1
    for v in "fsdp optim_grads_params" "fsdp2 optim_grads_params" "fsdp no_shard" "ddp no_shard" \
             "fsdp optim_grads_params --recompute"; do
      set -- $v
      tag=$(echo "$v" | tr ' ' '-' | tr -d -)
      log "$model batch $b, one rank: --wrapper $1 --strategy $2 ${3:-}"
      timeout 200 "$bin/tessera-gpt" --backend cuda --model $model --precision bf16 --batch $b --steps 12 --log-every 1 \
        --json --data "$gpt_text" --text --wrapper $1 --strategy $2 ${3:-} >"$OUT/gpt-variant-$tag.json" \
        2>"$LOGS/gpt-variant-$tag.err" || status=1
      python3 bench/gpt_speed_summary.py "$OUT/gpt-variant-$tag.json" "$OUT/gpt-variants-compile.json" | tee -a "$OUT/summary.txt"
    done
  fi
  if [[ " $gpt_parts " == *" multi "* ]]; then
    # GPT-2 at all of this machine's GPUs (one rank each, NCCL), --batch per GPU: tessera-gpt under
    # ddp / no_shard, fsdp and fsdp2 / optim_grads_params beside PyTorch FSDP2 with torch.compile
    # (bench/torch_gpt2.py --fsdp2 under torchrun) in the same call, tokens/s per GPU, and weak
    # scaling against tessera-gpt on one GPU (issue 39; at one GPU it is the script's dry run).
    ngpu=$(nvidia-smi -L | grep -c '^GPU')
    for spec in ${TESSERA_GPT_MULTI_SIZES:-gpt2:32 gpt2-medium:16 gpt2-xl:8}; do
      model=${spec%%:*} b=${spec##*:}
      common="--backend cuda --model $model --precision bf16 --batch $b --steps 12 --log-every 1 --json --data $gpt_text --text"
      log "gpt multi: $model, batch $b per GPU, $ngpu GPU(s)"
      timeout 300 "$bin/tessera-gpt" $common >"$OUT/gpt-multi-$model-np1.json" 2>"$LOGS/gpt-multi-$model-np1.err" || status=1
      for v in "ddp no_shard" "fsdp optim_grads_params" "fsdp2 optim_grads_params"; do
        set -- $v
        timeout 300 mpirun --bind-to none -np "$ngpu" "$bin/tessera-gpt" $common --wrapper $1 --strategy $2 \
          >"$OUT/gpt-multi-$model-np$ngpu-$1-$2.json" 2>"$LOGS/gpt-multi-$model-np$ngpu-$1-$2.err" || status=1
      done
      # PyTorch FSDP2 eager and with torch.compile (its hooks break the compiled graph per block): the better is the peer.
      for c in eager compile; do
        timeout 500 python3 -m torch.distributed.run --nproc-per-node "$ngpu" bench/torch_gpt2.py --fsdp2 \
          $([ $c = compile ] && echo --compile) --model $model --precision bf16 --batch $b --seq 1024 --steps 30 \
          >"$OUT/gpt-multi-$model-fsdp2-torch-$c.json" 2>"$LOGS/gpt-multi-$model-fsdp2-torch-$c.err" \
          || { status=1; tail -5 "$LOGS/gpt-multi-$model-fsdp2-torch-$c.err"; }
      done
      for v in ddp-no_shard fsdp-optim_grads_params fsdp2-optim_grads_params; do
        python3 bench/gpt_speed_summary.py "$OUT/gpt-multi-$model-np$ngpu-$v.json" "$OUT/gpt-multi-$model-fsdp2-torch-eager.json" \
          "$OUT/gpt-multi-$model-fsdp2-torch-compile.json" "$OUT/gpt-multi-$model-np1.json" | tee -a "$OUT/summary.txt"
      done
    done
  fi
  if [[ " $gpt_parts " == *" learn "* ]]; then
    prose=${TESSERA_GPT_PROSE:-}
    if [ ! -f "$prose/prose-train.txt" ] || [ ! -f "$prose/prose-val.txt" ]; then
      log "FAIL gpt learn: TESSERA_GPT_PROSE names no folder with prose-train.txt and prose-val.txt"; status=1
    else
      n=${TESSERA_GPT_LEARN_STEPS:-1200}
      log "gpt learn: 124M's shape over bytes, $n steps of 16 x 1024, validation every 50"
      timeout 500 "$bin/tessera-gpt" --backend cuda --model gpt2 --vocab 256 --precision bf16 --batch 16 --steps $n \
        --warmup 50 --lr 6e-4 --min-lr 6e-5 --log-every 10 --val-every 50 --val-batches 8 --json --text \
        --data "$prose/prose-train.txt" --val-data "$prose/prose-val.txt" --sample 300 \
        >"$OUT/gpt-learn.json" 2>"$LOGS/gpt-learn.err" || status=1
      if python3 bench/plot_gpt_learning.py "$OUT/gpt-learn.json" "$prose/prose-train.txt" "$OUT/gpt-learn.png" \
           >"$LOGS/gpt-learn.txt" 2>&1; then
        log "PASS gpt learns: $(tail -1 "$LOGS/gpt-learn.txt")"
      else
        log "FAIL gpt learns: $(tail -3 "$LOGS/gpt-learn.txt")"; status=1
      fi
      grep -E '^sample' "$OUT/gpt-learn.json" | tee -a "$OUT/summary.txt" || true
    fi
  fi
  if [[ " $gpt_parts " == *" profile "* ]]; then
    # One step of tessera-gpt (the last, an NVTX range) under Nsight Compute, every kernel timed alone.
    model=${TESSERA_GPT_PROFILE:-gpt2:8}
    b=${model##*:} model=${model%%:*}
    # Each kernel's DRAM bytes too (TESSERA_GPT_PROFILE_BYTES=0: times only, fewer replays), set
    # against the device copy's speed measured here: the schedule's floor (ncu_step_summary.py).
    metrics=gpu__time_duration.sum summary_args=()
    if [ "${TESSERA_GPT_PROFILE_BYTES:-1}" = 1 ]; then
      copy_gbs=$(python3 bench/torch_adamw.py --log2-elements 28 --copy-only | awk '/^torch copy:/ {print $5}')
      if [ -n "$copy_gbs" ]; then
        log "device copy (read + write) for the profile's floor: $copy_gbs GB/s"
        metrics+=,dram__bytes_read.sum,dram__bytes_write.sum summary_args=(--copy-gbs "$copy_gbs")
      else log "FAIL device copy (bench/torch_adamw.py --copy-only): the profile has times only"; status=1; fi
    fi
    # ncu_step NAME LABEL NCU-FLAGS... -- COMMAND...: one step under ncu, every kernel timed alone, summed by class.
    ncu_step() {
      local name=$1 label=$2; shift 2
      local flags=(); while [ "$1" != -- ]; do flags+=("$1"); shift; done; shift
      if ncu "${flags[@]}" --clock-control none --metrics "$metrics" --csv "$@" \
           >"$OUT/profile-$name.csv" 2>"$LOGS/profile-$name.err"; then
        python3 bench/ncu_step_summary.py "$OUT/profile-$name.csv" "${summary_args[@]}" >"$OUT/profile-$name.txt" 2>&1
        log "$label: $(grep -F '**sum**' "$OUT/profile-$name.txt" | head -1)"
        grep -A40 '^| kernels of one step' "$OUT/profile-$name.txt" | tee -a "$OUT/summary.txt"
      else
        log "FAIL $label"; tail -5 "$LOGS/profile-$name.err"; status=1
      fi
    }
    # The fused forms, which a normal run's timing picks (its JSON `products`): under ncu's replay that
    # timing is distorted and picked separate bias adds for proj and fc_proj.
    ncu_step gpt-$model "gpt profile $model" --nvtx --nvtx-include "tessera-step/" -- \
      env TESSERA_PRODUCT_FORMS=fused "$bin/tessera-gpt" --backend cuda --model $model --precision bf16 --batch $b --steps 2 --data "$gpt_text" --text
    # The same step of PyTorch with torch.compile (TESSERA_GPT_PROFILE_TORCH=1): its last step, between
    # cudaProfilerStart and Stop (autograd's threads launch the backward: an NVTX range would miss them).
    if [ "${TESSERA_GPT_PROFILE_TORCH:-0}" = 1 ]; then
      ncu_step torch-$model "torch.compile profile $model" --profile-from-start off -- \
        python3 bench/torch_gpt2.py --model $model --precision bf16 --batch $b --seq 1024 --steps 8 --compile --profile-last
    fi
  fi
fi
