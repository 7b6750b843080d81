# scripts/gpu-check stage mesh (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): hybrid sharding. One GPU: the CUDA suite's mesh cases at 1 rank (NCCL) and at 4
# ranks (staged MPI: meshes 1x4, 2x2, 4x1) and the trainer at mesh 2x2 beside one rank. Two or
# more GPUs (one rank each, NCCL): the suite at every mesh; the step at mesh 1xN beside flat fsdp
# and Nx1 beside ddp; then over an emulated slow link (NCCL's socket transport on loopback:
# NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo) mesh Nx1 (replicate across it)
# vs 1xN (shard across it) on the 1B and 34M models, and the collectives over that link;
# TESSERA_MESH_PARTS="suite nvlink slow1b slow34m slowcoll" picks parts (calls stay under 10 min).
gpus=$(nvidia-smi -L | grep -c '^GPU')
parts=${TESSERA_MESH_PARTS:-suite nvlink slow1b slow34m slowcoll}
part() { [[ " $parts " == *" $1 "* ]]; }
if part suite; then
  filter='--run_test=mesh_matches_single_rank_no_shard*'
  run_np mesh-suite-np1 1 "$bin/test-strategies-cuda" "$filter"
  run_np mesh-suite-np4-mpi 4 "$bin/test-strategies-cuda" "$filter"
  [ "$gpus" -ge 2 ] && run_np mesh-suite-nccl-np$gpus "$gpus" "$bin/test-strategies-cuda" "$filter"
  tr="--backend cuda --layers 2 --d 256 --ctx 8 --tokens 4096 --steps 30 --json --wrapper fsdp --strategy optim_grads_params"
  for spec in "1 --comm auto" "4 --comm mpi --shard-group 2 --outer optim" "4 --comm mpi --shard-group 2"; do
    set -- $spec; np=$1; shift
    echo "# $np ranks $*: $(mpirun --bind-to none -np "$np" "$bin/tessera-mlp-lm" $tr "$@" 2>&1 | tail -1)" |
      tee -a "$OUT/mesh.txt"
  done
fi
if [ "$gpus" -ge 2 ]; then
  flags="--strategies optim_grads_params --copy-engine-gathers --lend-grad-shards --recompute-gelu --steps 20"
  if part nvlink; then  # the same traffic as flat fsdp (1xN) and as ddp (Nx1)
    for spec in "flat --wrapper fsdp" "1xN --wrapper fsdp --shard-group $gpus" "Nx1 --wrapper fsdp --shard-group 1" \
                "ddp --wrapper ddp --strategies optim_grads" "1xN-hfsdp --wrapper fsdp --shard-group $gpus --outer optim"; do
      set -- $spec; name=$1; shift
      mpirun --bind-to none -np "$gpus" "$bin/tessera-bench-train" $M1B --tokens $((8192 * gpus)) \
        $flags "$@" --json "$OUT/mesh-nvlink-$name.json" 2>&1 | tee -a "$OUT/mesh.txt" || status=1
    done
  fi
  slow=(-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo)
  for spec in "slow1b 8192 $M1B" "slow34m 4096 $M34M"; do
    set -- $spec; name=$1 per_gpu=$2; shift 2
    part "$name" || continue
    model=("$@")
    for m in "replicate --shard-group 1" "shard --shard-group $gpus" "hfsdp --shard-group 1 --outer optim"; do
      set -- $m; label=$1; shift
      mpirun --bind-to none -np "$gpus" "${slow[@]}" "$bin/tessera-bench-train" "${model[@]}" "$@" \
        --tokens $((per_gpu * gpus)) --wrapper fsdp $flags --no-overlap --json "$OUT/mesh-$name-$label.json" 2>&1 |
        tee -a "$OUT/mesh.txt" || status=1
    done
  done
  part slowcoll && { mpirun --bind-to none -np "$gpus" "${slow[@]}" "$bin/tessera-collectives" --backend cuda --comm nccl \
    -d bf16 -b 1M -e 256M -f 4 -i raw,unit -w 2 -n 5 --json "$OUT/mesh-slow-collectives.json" 2>&1 |
    tee -a "$OUT/mesh.txt" || status=1; }
fi
