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

# torch_curves NAME TRAINER PEER STEPS: tests/trainer/compare_torch.py in fp32 and bf16 (the trainer
# against its plain-PyTorch peer from the same weights on the same batches of $TESSERA_GPT_TEXT).
torch_curves() {
  local name=$1 trainer=$2 peer=$3 steps=$4 prec
  for prec in fp32 bf16; do
    if python3 tests/trainer/compare_torch.py "$trainer" "$peer" "$TESSERA_GPT_TEXT" $prec "$steps" \
         >"$LOGS/$name-torch-$prec.log" 2>&1; then
      log "PASS $name = torch ($prec): $(tail -1 "$LOGS/$name-torch-$prec.log")"
    else
      log "FAIL $name = torch ($prec)"; tail -20 "$LOGS/$name-torch-$prec.log"; status=1
    fi
    grep -E '^step|^bf16 from' "$LOGS/$name-torch-$prec.log" >>"$OUT/summary.txt"
  done
}
# The binaries: prebuilt ones from $TESSERA_GPU_BIN, else a release build here (build-gpu/bin).
gpu_binaries() {
  bin=${TESSERA_GPU_BIN:-}
  if [ -n "$bin" ] && [ -n "${TESSERA_GPU_TARGETS:-}" ]; then  # just those, prebuilt
    local t; for t in $TESSERA_GPU_TARGETS; do
      [ -x "$bin/$(basename "$t")" ] || { log "FAIL $bin has no $(basename "$t")"; return 1; }
    done
    log "using prebuilt $TESSERA_GPU_TARGETS from $bin"
    return 0
  fi
  if [ -n "$bin" ] && "$bin/test-kernels-cuda" --list_content >/dev/null 2>&1; then
    log "using prebuilt binaries from $bin"
    return 0
  fi
  log "building (meson, -Dcuda=enabled)"
  # TESSERA_CUDNN_FRONTEND: a folder with cudnn_frontend.h (carried: the GPU machine has no package registry).
  [ -f build-gpu/build.ninja ] || meson setup build-gpu -Dcuda=enabled --buildtype=release \
    ${TESSERA_CUDNN_FRONTEND:+-Dcudnn-frontend=$TESSERA_CUDNN_FRONTEND} >"$LOGS/build.log" 2>&1
  # TESSERA_GPU_TARGETS narrows the build (e.g. "examples/tessera-gpt tools/tessera-plan" for the gpt stage).
  local targets=(${TESSERA_GPU_TARGETS:-tests/test-kernels-cuda tests/test-strategies-cuda tests/test-mlp-kernels-cuda
                 tests/test-gpt-kernels-cuda tests/test-fp8-cuda bench/tessera-bench-optim bench/tessera-bench-train bench/tessera-bench-rows bench/tessera-bench-init
                 bench/tessera-collectives examples/tessera-mlp-lm examples/tessera-gpt tools/tessera-consolidate
                 tools/tessera-doctor tools/tessera-plan tests/fault-divergent})
  # Without Boost (the GPU machine has none) meson builds no suites: build what it knows.
  local t known=()
  for t in "${targets[@]}"; do ninja -C build-gpu -t query "$t" >/dev/null 2>&1 && known+=("$t"); done
  [ ${#known[@]} -lt ${#targets[@]} ] && log "building ${#known[@]} of ${#targets[@]} targets (no Boost.Test: no suites)"
  if ! ninja -C build-gpu "${known[@]}" >>"$LOGS/build.log" 2>&1; then
    tail -40 "$LOGS/build.log"; return 1
  fi
  bin=build-gpu/bin
  mkdir -p "$bin"
  for t in "${known[@]}"; do cp "build-gpu/$t" "$bin/"; done
}
