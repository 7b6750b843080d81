# scripts/gpu-check stage test (sourced; uses bench/gpu/common.sh's $bin, $OUT, $LOGS,
# log, run_np, status): the CUDA suites at 1-4 MPI ranks sharing the GPU (staged MPI), and at one
# rank per GPU over NCCL where the machine has more than 4.
for np in 1 2 3; do run_np kernels-np$np $np "$bin/test-kernels-cuda"; done
for np in 1 2 3 4; do run_np strategies-np$np $np "$bin/test-strategies-cuda"; done
run_np mlp-kernels-np1 1 "$bin/test-mlp-kernels-cuda"
# with one GPU per rank the suites also run NCCL at that world size
gpus=$(nvidia-smi -L | grep -c '^GPU')
[ "$gpus" -gt 4 ] && run_np strategies-np$gpus "$gpus" "$bin/test-strategies-cuda"
