#!/usr/bin/env python3
"""bench/ncu_step_summary.py on a small Nsight Compute CSV written here: kernels
classified, times and DRAM bytes summed per class in ncu's scaled units, each
memory-bound class against its bytes at copy speed, and the schedule's floor
(GEMM and attention as measured + the rest's bytes at copy speed).

usage: check_ncu_summary.py SUMMARY.py"""
import csv
import io
import os
import re
import subprocess
import sys
import tempfile

summary = sys.argv[1]
hdr = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size", "Grid Size",
       "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
# (kernel, us, MB read, MB written): a GEMM, cuDNN's attention, a LayerNorm and the loss.
kernels = [("nvjet_tst_128x256_h_bz_coopA_NTN", 400.0, 30.0, 10.0),
           ("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x64_4x1x1_kernel0_0_fprop", 250.0, 20.0, 5.0),
           ("void gpt::layernorm_rows_kernel<tessera::bf16, 13>(...)", 30.0, 40.0, 40.0),  # the row form (layernorm_kernel: D > 2048 or unaligned)
           ("void gpt::kernels::cross_entropy_kernel<tessera::bf16, 1>(...)", 300.0, 412.0, 412.0)]
out = io.StringIO()
w = csv.writer(out, quoting=csv.QUOTE_ALL)
out.write('==PROF== Connected to process 1 (tessera-gpt)\n')
w.writerow(hdr)
for i, (name, us, rd, wr) in enumerate(kernels):
    base = [str(i), "1", "tessera-gpt", "127.0.0.1", name, "1", "13", "(256, 1, 1)", "(132, 1, 1)", "0", "9.0",
            "Command line profiler metrics"]
    # ncu scales units unless told not to: time in usecond, bytes in Mbyte and Kbyte.
    w.writerow(base + ["dram__bytes_read.sum", "Mbyte", f"{rd:,.2f}"])
    w.writerow(base + ["dram__bytes_write.sum", "Kbyte", f"{wr * 1000:,.0f}"])
    w.writerow(base + ["gpu__time_duration.sum", "usecond", f"{us:,.2f}"])
tmp = tempfile.mkdtemp(prefix="tessera-ncu-")
path = os.path.join(tmp, "step.csv")
open(path, "w").write(out.getvalue())

failures = []
plain = subprocess.run([sys.executable, summary, path], capture_output=True, text=True, check=True).stdout
if "| **sum** | 4 | **980.0** |" not in plain or "MB moved" in plain:
    failures.append("without --copy-gbs: expected 4 kernels summing to 980.0 us and no byte columns:\n" + plain)
res = subprocess.run([sys.executable, summary, path, "--copy-gbs", "4000"], capture_output=True, text=True, check=True)
text = res.stdout
print(text)
# At 4000 GB/s a MB takes 0.25 us: LayerNorm 80 MB -> 20 us (took 30: 1.50x), the loss 824 MB -> 206 us
# (took 300: 1.46x); the floor = 400 + 250 (as measured) + 20 + 206 = 876 us of 980.
for want in ["| LayerNorm forward | 1 | 30.0 | 30.0 | 3.1% | 80.0 | 20.0 | 1.50 |",
             "| cross-entropy (loss and gradient in place) | 1 | 300.0 | 300.0 | 30.6% | 824.0 | 206.0 | 1.46 |",
             "GEMM and attention kernels as measured 650.0 us",
             "226.0 us = 876.0 us; the step's kernels sum to 980.0 us (89.4% of it is the floor)"]:
    if want not in text:
        failures.append(f"missing: {want}")
# A missing or bad speed is one tessera: line and exit 1, not a traceback.
for bad, part in [([], "got nothing"), (["abc"], "got abc"), (["-3"], "is not a positive speed")]:
    res = subprocess.run([sys.executable, summary, path, "--copy-gbs"] + bad, capture_output=True, text=True)
    if res.returncode != 1 or not res.stderr.startswith("tessera: --copy-gbs") or part not in res.stderr \
            or "Traceback" in res.stderr:
        failures.append(f"--copy-gbs {bad}: exit {res.returncode}, stderr {res.stderr!r}")
if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("ncu summary: classes, bytes at copy speed and the floor as computed by hand")
