# scripts/gpu-check stage fp8 (sourced; uses bench/gpu/common.sh's $bin, run_np, log, status):
# the fp8 suite at 1-3 MPI ranks sharing the GPU: the library's casts against the
# hardware's at every float, fp8_gather over staged MPI equal bit for bit to the
# host's cast of the gathered tensor, cuBLASLt's fp8 products against float64.
for np in 1 2 3; do run_np fp8-np$np $np "$bin/test-fp8-cuda"; done
