# What every scripts/gpu-check stage shares (sourced by the driver before any
# stage): where results go, the environment the machine needs, the binaries,
# the two reference MLP models, and the helpers log / has / run_np.
OUT=${OUT:-$PWD/gpu-check-out}
# Only a few files come back from the device tool: logs go to $LOGS and are
# packed into $OUT/logs.tar.gz at the end; summary and benchmark JSON stay on top.
LOGS=$(mktemp -d)
mkdir -p "$OUT"
export PATH=/usr/local/cuda/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_NVLS_ENABLE=0  # keep NVLink multicast off on shared machines
status=0
# The two reference models every MLP stage times (tessera-mlp-lm's shapes; bench/torch_mlp_lm.py takes the same flags).
M1B="--layers 8 --d 4096 --ctx 8"   # 1.07B parameters
M34M="--layers 4 --d 1024 --ctx 8"  # 34M
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
has() { [[ " $stages " == *" $1 "* ]]; }  # a whole word of $stages
pack() { tar -czf "$OUT/logs.tar.gz" -C "$LOGS" . 2>/dev/null; }

run_np() {  # run_np NAME NP BINARY ARGS...: one multi-rank run with its own timeout
  local name=$1 np=$2; shift 2
  if timeout 600 mpirun --oversubscribe --bind-to none -np "$np" "$@" >"$LOGS/$name.log" 2>&1; then
    log "PASS $name: $(grep -c . "$LOGS/$name.log") lines, $(grep -ho 'Running [0-9]* test cases' "$LOGS/$name.log" | head -1)"
  else
    log "FAIL $name (exit $?)"; tail -30 "$LOGS/$name.log"; status=1
  fi
}

# The binaries: prebuilt ones from $TESSERA_GPU_BIN, else a release build here (build-gpu/bin).
gpu_binaries() {
  bin=${TESSERA_GPU_BIN:-}
  if [ -n "$bin" ] && "$bin/test-kernels-cuda" --list_content >/dev/null 2>&1; then
    log "using prebuilt binaries from $bin"
    return 0
  fi
  log "building (meson, -Dcuda=enabled)"
  [ -f build-gpu/build.ninja ] || meson setup build-gpu -Dcuda=enabled --buildtype=release >"$LOGS/build.log" 2>&1
  local targets=(tests/test-kernels-cuda tests/test-strategies-cuda tests/test-mlp-kernels-cuda tests/test-gpt-kernels-cuda
                 bench/tessera-bench-optim bench/tessera-bench-train bench/tessera-bench-rows bench/tessera-collectives
                 examples/tessera-mlp-lm examples/tessera-gpt tools/tessera-consolidate tools/tessera-doctor
                 tools/tessera-plan tests/fault-divergent)
  if ! ninja -C build-gpu "${targets[@]}" >>"$LOGS/build.log" 2>&1; then
    tail -40 "$LOGS/build.log"; return 1
  fi
  bin=build-gpu/bin
  mkdir -p "$bin"
  local t; for t in "${targets[@]}"; do cp "build-gpu/$t" "$bin/"; done
}
