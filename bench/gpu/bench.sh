# scripts/gpu-check stage bench (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): the optimizer benchmark (tessera-bench-optim) beside PyTorch's fused AdamW
# (bench/torch_adamw.py); TESSERA_BENCH_ARGS adds flags.
"$bin/tessera-bench-optim" --json "$OUT/optim.json" ${TESSERA_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench-optim.txt" || status=1
python3 bench/torch_adamw.py --json "$OUT/torch_adamw.json" 2>&1 | tee -a "$OUT/bench-optim.txt" || true
