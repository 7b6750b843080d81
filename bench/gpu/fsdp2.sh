# scripts/gpu-check stage fsdp2 (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): at every GPU (one rank each): fsdp2 beside fsdp and PyTorch FSDP2 on the 1B
# and 34M models (order fsdp, fsdp2, torch, fsdp2, fsdp), the unit collectives of both layouts
# beside raw NCCL (copy-out and copy-in included), and CUDA_DEVICE_MAX_CONNECTIONS unset / 1 / 8;
# rows: tessera-bench-rows, the copy-out / copy-in kernels beside a device copy (one GPU).
# TESSERA_FSDP2_PARTS="suite rows collectives 1b 34m connections" picks parts (calls stay under 10 min).
gpus=$(nvidia-smi -L | grep -c '^GPU')
F=$LOGS/fsdp2; mkdir -p "$F"
parts=${TESSERA_FSDP2_PARTS:-suite rows collectives 1b 34m connections}
part() { [[ " $parts " == *" $1 "* ]]; }
flags="--strategies optim_grads_params --copy-engine-gathers --lend-grad-shards --recompute-gelu --steps 20"
if part suite; then
  run_np strategies-cuda-np1 1 "$bin/test-strategies-cuda"
  run_np strategies-cuda-np3-mpi 3 "$bin/test-strategies-cuda"
  [ "$gpus" -ge 2 ] && run_np strategies-nccl-np$gpus "$gpus" "$bin/test-strategies-cuda"
fi
part rows && { "$bin/tessera-bench-rows" --json "$OUT/fsdp2-rows.json" 2>&1 | tee -a "$OUT/fsdp2.txt" || status=1; }
part collectives && { mpirun --bind-to none -np "$gpus" "$bin/tessera-collectives" --backend cuda --comm nccl -d bf16 \
  -b 4M -e 1G -f 4 -o all_gather,reduce_scatter -i raw,unit,unit2 -w 3 -n 20 --json "$OUT/fsdp2-collectives.json" \
  2>&1 | tee -a "$OUT/fsdp2.txt" || status=1; }
# Tokens per GPU first (tessera-bench-train takes the whole job's, PyTorch each process's).
for spec in "1b 8192 $M1B" "34m 4096 $M34M"; do
  set -- $spec; name=$1 per_gpu=$2; shift 2
  part "$name" || continue
  i=0
  for side in fsdp fsdp2 torch fsdp2 fsdp; do
    i=$((i + 1))
    if [ "$side" = torch ]; then
      timeout 600 python3 -m torch.distributed.run --nproc-per-node "$gpus" bench/torch_mlp_lm.py --fsdp2 "$@" \
        --tokens "$per_gpu" --steps 20 --json "$OUT/fsdp2-$name-$i-torch.json" 2>&1 | grep -v '^W' |
        tee -a "$OUT/fsdp2.txt" || status=1
    else
      mpirun --bind-to none -np "$gpus" "$bin/tessera-bench-train" "$@" --tokens $((per_gpu * gpus)) \
        --wrapper "$side" $flags --json "$OUT/fsdp2-$name-$i-$side.json" 2>&1 | tee -a "$OUT/fsdp2.txt" || status=1
    fi
  done
done
for conn in unset 1 8; do
  part connections || break
  pass=(); [ "$conn" != unset ] && pass=(-x CUDA_DEVICE_MAX_CONNECTIONS="$conn")
  echo "# CUDA_DEVICE_MAX_CONNECTIONS=$conn" | tee -a "$OUT/fsdp2.txt"
  mpirun --bind-to none -np "$gpus" "${pass[@]}" "$bin/tessera-bench-train" $M1B \
    --tokens $((8192 * gpus)) --wrapper fsdp --strategies optim_grads_params --steps 20 \
    --json "$OUT/fsdp2-connections-$conn.json" 2>&1 | tee -a "$OUT/fsdp2.txt" || status=1
done
