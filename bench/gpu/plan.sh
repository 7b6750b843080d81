# scripts/gpu-check stage plan (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): (issue 17) steps the planner's calibration never saw, then tessera-plan validate
# on them against the committed topology (bench/results/*-topology.json): at one GPU the 1B model
# at 4096 and 16384 tokens and with 2 micro-batches, a narrow-deep (d 2048) and a wide (d 8192)
# model, 34M at 8192 tokens; at every GPU of the machine where it has several (one rank each,
# NCCL) the 1B step flat, with copy-engine gathers, optim_grads and ddp, and meshes; then the
# trainer's --plan auto on the 1B model. TESSERA_PLAN_PARTS="one multi auto" picks parts.
P=$LOGS/plan; mkdir -p "$P/results"
parts=" ${TESSERA_PLAN_PARTS:-one multi auto} "
gpus=$(nvidia-smi -L | grep -c '^GPU')
topo=$(ls bench/results/*-topology.json | tail -1)
step() {  # step NAME NP FLAGS...: one tessera-bench-train --json into the validation folder
  local name=$1 np=$2; shift 2
  timeout 300 mpirun --bind-to none -np "$np" "$bin/tessera-bench-train" --steps 10 --json "$P/results/$name.json" "$@" \
    >"$P/$name.txt" 2>&1 || { log "FAIL plan step $name"; tail -5 "$P/$name.txt"; status=1; }
}
if [[ $parts == *" one "* ]]; then
  step 1b-t4096 1 $M1B --tokens 4096 --strategies optim_grads_params
  step 1b-t16384 1 $M1B --tokens 16384 --strategies optim_grads_params
  step 1b-accum2 1 $M1B --tokens 16384 --accum 2 --strategies optim_grads_params
  step d2048-l16 1 --layers 16 --d 2048 --ctx 8 --tokens 8192 --strategies optim_grads_params
  step d8192-l2 1 --layers 2 --d 8192 --ctx 8 --tokens 8192 --strategies optim_grads_params
  step 34m-t8192 1 $M34M --tokens 8192 --strategies optim_grads_params,no_shard
fi
if [[ $parts == *" multi "* ]] && [ "$gpus" -ge 2 ]; then
  t=$((8192 * gpus)); m="$M1B --tokens $t --comm nccl"
  step multi-1b "$gpus" $m --strategies optim_grads_params,optim_grads
  step multi-1b-ce "$gpus" $m --strategies optim_grads_params --copy-engine-gathers
  step multi-1b-ddp "$gpus" $m --wrapper ddp --strategies no_shard
  step multi-1b-hsdp "$gpus" $m --strategies optim_grads_params --shard-group $((gpus / 2))
  step multi-d2048 "$gpus" --layers 16 --d 2048 --ctx 8 --tokens $t --comm nccl --strategies optim_grads_params
fi
if ls "$P/results"/*.json >/dev/null 2>&1; then
  "$bin/tessera-plan" validate --results "$P/results" --topology "$topo" >"$P/validate.txt" 2>&1
  rc=$?
  cat "$P/validate.txt" >>"$OUT/summary.txt"
  log "plan validate on this run's steps (topology $(basename "$topo")): exit $rc"
fi
if [[ $parts == *" auto "* ]]; then
  timeout 300 "$bin/tessera-mlp-lm" --backend cuda --precision bf16 $M1B --tokens 8192 --steps 3 \
    --log-every 1 --lr 1e-4 --plan auto --topology "$topo" --gpu-memory 22 >"$P/auto.txt" 2>&1 &&
    log "plan auto 1B in 22 GiB: $(grep 'plan auto' "$P/auto.txt" | cut -c1-220); $(grep '^done' "$P/auto.txt")" ||
    { log "FAIL plan auto"; tail -5 "$P/auto.txt"; status=1; }
fi
cp "$P/results"/*.json "$OUT/" 2>/dev/null
tar -czf "$OUT/plan.tar.gz" -C "$P" .
