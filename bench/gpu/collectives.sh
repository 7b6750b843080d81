# scripts/gpu-check stage collectives (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): the collectives benchmark. One GPU: NCCL at world size 1, and 2 ranks
# sharing the GPU through staged MPI. Several GPUs: NCCL with one rank per GPU, 8 B to 4 GiB.
# TESSERA_COLL_MIN, TESSERA_COLL_MAX (sizes, e.g. 1M 256M) and TESSERA_COLL_IMPLS (e.g.
# raw,unit,units) narrow the sweep.
# One GPU: NCCL at world size 1, and 2 ranks sharing the GPU through staged MPI.
# Several GPUs: NCCL with one rank per GPU, 8 B to 4 GiB.
C=$LOGS/collectives; mkdir -p "$C"
gpus=$(nvidia-smi -L | grep -c '^GPU')
# TESSERA_COLL_MIN / TESSERA_COLL_MAX narrow the sizes, TESSERA_COLL_IMPLS the implementations (-i).
lo=${TESSERA_COLL_MIN:-8}
if [ "$gpus" -gt 1 ]; then
  specs=("nccl $gpus float $lo ${TESSERA_COLL_MAX:-4G}" "nccl $gpus bf16 $lo ${TESSERA_COLL_MAX:-4G}")
else
  specs=("nccl 1 float $lo ${TESSERA_COLL_MAX:-1G}" "nccl 1 bf16 $lo ${TESSERA_COLL_MAX:-1G}" "mpi 2 float $lo ${TESSERA_COLL_MAX:-256M}")
fi
for spec in "${specs[@]}"; do
  set -- $spec
  name=collectives-$1-np$2-$3
  if mpirun --oversubscribe --bind-to none -np "$2" "$bin/tessera-collectives" --backend cuda --comm "$1" -d "$3" \
       -b "$4" -e "$5" -f 4 -w 3 -n 10 ${TESSERA_COLL_IMPLS:+-i "$TESSERA_COLL_IMPLS"} --json "$C/$name.json" >"$C/$name.txt" 2>&1; then
    log "PASS $name: $(grep -h 'Out of bounds' "$C/$name.txt")"
  else
    log "FAIL $name"; tail -20 "$C/$name.txt"; status=1
  fi
done
for j in "$C"/collectives-*.json; do
  python3 bench/plot_collectives.py "${j%.json}" "$j" >/dev/null 2>&1 || true
done
tar -czf "$OUT/collectives.tar.gz" -C "$C" .
