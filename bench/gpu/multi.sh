# scripts/gpu-check stage multi (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): on a machine with several GPUs, one rank per GPU with NCCL: the strategy
# suite, the training step at 1 GPU and at all of them (weak scaling, 8192 tokens per GPU), and
# checkpoints saved at 4 ranks per GPU loading at one rank per GPU and the reverse.
gpus=$(nvidia-smi -L | grep -c '^GPU')
if [ "$gpus" -lt 2 ]; then
  log "SKIP multi: one GPU"
else
  M=$LOGS/multi; mkdir -p "$M"
  run_np strategies-nccl-np$gpus "$gpus" "$bin/test-strategies-cuda"
  # Weak scaling: the 1B step at 8192 tokens per GPU on one GPU, then on all.
  model="$M1B --steps ${TESSERA_MULTI_STEPS:-10}"
  # Then optim_grads_params keeping every gathered unit from forward to
  # backward (11 buffers: nothing re-gathered), reducing in bf16, both, and
  # recomputing GELU outputs in backward (less activation memory), gradient
  # shards lent to activations (wrapper_options::lend_grad_shards), both,
  # and all-gathers on copy engines (nccl_options::copy_engine_gathers).
  for spec in "1 no_shard,optim_grads_params fsdp base" "$gpus no_shard,optim,optim_grads,optim_grads_params fsdp base" \
              "$gpus no_shard ddp base" "$gpus optim_grads_params fsdp keep --gather-buffers 11" \
              "$gpus optim_grads_params fsdp bf16wire --wire bf16" \
              "$gpus optim_grads_params fsdp keep-bf16wire --gather-buffers 11 --wire bf16" \
              "$gpus optim_grads_params fsdp recompute --recompute-gelu" \
              "$gpus optim_grads_params fsdp lend --lend-grad-shards" \
              "$gpus optim_grads_params fsdp lend-recompute --lend-grad-shards --recompute-gelu" \
              "$gpus optim_grads_params fsdp ce --copy-engine-gathers" \
              "$gpus optim_grads_params fsdp ce-lend-recompute --copy-engine-gathers --lend-grad-shards --recompute-gelu" \
              "1 optim_grads_params fsdp recompute --recompute-gelu"; do
    set -- $spec
    np=$1 strategies=$2 wrapper=$3 tag=$4; shift 4
    mpirun --bind-to none -np "$np" "$bin/tessera-bench-train" $model --tokens $((8192 * np)) --strategies "$strategies" \
      --wrapper "$wrapper" "$@" --json "$OUT/train-np$np-$wrapper-$tag.json" 2>&1 | tee -a "$OUT/multi.txt" || status=1
  done
  python3 bench/plot_train.py "$OUT/train-multi.png" "$OUT/multi.txt" \
    --ref "target at 2 GPUs=95000,PyTorch FSDP2 2 GPUs=78000,PyTorch 1 GPU=80300" \
    --mem-ref "PyTorch FSDP2 2 GPUs=11.8" >/dev/null 2>&1 || true
  # Checkpoints across world sizes: 4 ranks per GPU (staged MPI) <-> one per GPU (NCCL).
  many=$((4 * gpus))
  for prec in "fp32 1e-5" "bf16 2e-2"; do
    set -- $prec
    ck="--backend cuda --precision $1 --layers 4 --d 512 --ctx 8 --tokens 4096 --lr 1e-3"
    for pair in "$many:--comm mpi:$gpus:--comm nccl" "$gpus:--comm nccl:$many:--comm mpi"; do
      IFS=: read -r a fa b fb <<<"$pair"
      if python3 tests/checkpoint/reshard_ranks.py mpirun "$bin/tessera-mlp-lm" "$2" "$a" "$fa --strategy optim_grads_params" \
           "$b" "$fb --strategy optim_grads_params" $ck >>"$M/reshard.log" 2>&1; then
        log "PASS checkpoint $1 $a -> $b ranks: $(tail -1 "$M/reshard.log")"
      else
        log "FAIL checkpoint $1 $a -> $b ranks"; tail -5 "$M/reshard.log"; status=1
      fi
    done
  done
fi
