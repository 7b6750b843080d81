# scripts/gpu-check stage offload (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): (issue 20) one GPU. The 1B optim_grads_params step without offload, with the
# whole optimizer offloaded and updated on the host, and across PCIe by the GPU
# (tessera-bench-train prints the host-memory and PCIe ceilings measured in the same run);
# then the fit size at d 4096: tessera-plan picks the most layers that fit the GPU without
# offload and with it (host memory as the other bound), and the trainer runs 3 steps at each
# ($bin must hold tessera-plan); TESSERA_OFFLOAD_PARTS="bench fit" picks parts.
F=$LOGS/offload; mkdir -p "$F"
parts=" ${TESSERA_OFFLOAD_PARTS:-bench fit} "  # calls stay under 10 min: one part per call at 1B sizes
one="$M1B --tokens 8192 --steps 6 --warmup 2 --strategies optim_grads_params"
if [[ $parts == *" bench "* ]]; then
"$bin/tessera-bench-train" $one --json "$F/1b-none.json" >"$F/1b-none.txt" 2>&1 || { log "FAIL offload bench none"; status=1; }
for where in host device; do
  "$bin/tessera-bench-train" $one --offload-optimizer 1 --offload-update $where --json "$F/1b-$where.json" \
    >"$F/1b-$where.txt" 2>&1 || { log "FAIL offload bench $where"; tail -5 "$F/1b-$where.txt"; status=1; }
done
"$bin/tessera-bench-train" $one --offload-optimizer 0.5 --offload-update host --json "$F/1b-half-host.json" \
  >"$F/1b-half-host.txt" 2>&1 || { log "FAIL offload bench half"; status=1; }
grep -h '^# offload ceilings' -A1 "$F/1b-host.txt" | tee -a "$OUT/summary.txt"
python3 - "$F" <<'PY' | tee -a "$OUT/summary.txt"
import json, os, sys
d = sys.argv[1]
for side in ('none', 'half-host', 'host', 'device'):
  f = f'{d}/1b-{side}.json'
  if not os.path.exists(f): continue
  j = json.load(open(f)); r = j['results'][0]
  print(f"== offload 1B {side}: step {r['ms']:.2f} ms, {r['tokens_per_s']:.0f} tokens/s, optimizer phase {r['optimizer_ms']:.2f} ms, "
        f"compute {r['compute_ms']:.2f} ms, peak {r['peak_bytes'] / 2**20:.0f} MiB (estimate {r['estimated_bytes'] / 2**20:.0f}), "
        f"offloaded {r.get('offloaded_bytes', 0) / 2**20:.0f} MiB, loss {r['final_loss']:.5f}")
PY
fi
if [[ $parts == *" fit "* ]]; then
# Fit size at d 4096 on this GPU: the planner's largest layer count (exit 3: does not fit), then 3 real steps.
gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{printf "%.1f", $1 / 1024 * 0.97}')
host_avail=$(awk '/MemAvailable/ {print $2 * 1024}' /proc/meminfo)
fit() {  # fit FLAGS...: the most layers (step 4) whose plan fits the GPU and 85% of the host's available memory
  local L=4 best=0
  while [ $L -le 400 ]; do
    j=$("$bin/tessera-plan" memory --layers $L --d 4096 --ctx 8 --tokens 8192 --gpus 1 --gpu-memory "$gib" --json "$@") || break
    off=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['offloaded_bytes'])" "$j")
    [ "$off" -le $((host_avail * 85 / 100)) ] || break
    best=$L; L=$((L + 4))
  done
  echo $best
}
for spec in "none" "device --offload-optimizer 1 --offload-update device" ${TESSERA_OFFLOAD_FIT_HOST:+"host --offload-optimizer 1 --offload-update host"}; do
  set -- $spec; name=$1; shift
  L=$(fit "$@")
  log "offload fit $name: the planner's most layers at d 4096 = $L ($("$bin/tessera-plan" memory --layers $L --d 4096 --ctx 8 --tokens 8192 --gpus 1 --json "$@" | python3 -c "import json,sys; j=json.load(sys.stdin); print(f\"{j['params']/1e9:.2f}B parameters, device {j['total_bytes']/2**30:.2f} GiB, host {j['offloaded_bytes']/2**30:.2f} GiB\")"))"
  timeout 280 "$bin/tessera-mlp-lm" --backend cuda --precision bf16 --layers $L --d 4096 --ctx 8 --tokens 8192 --steps 3 \
    --lr 1e-4 --log-every 1 "$@" >"$F/fit-$name.txt" 2>&1 && log "offload fit $name ran: $(grep '^done' "$F/fit-$name.txt")" ||
    { log "FAIL offload fit $name at $L layers"; tail -5 "$F/fit-$name.txt"; status=1; }
done
fi
tar -czf "$OUT/offload.tar.gz" -C "$F" .
