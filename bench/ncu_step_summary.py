#!/usr/bin/env python3
"""Summarises an Nsight Compute CSV of one training step (gpu-check stage `profile`).

ncu --nvtx --nvtx-include "tessera-step/" --metrics gpu__time_duration.sum --csv times each
kernel of tessera-bench-train's last step alone, at the clocks of a kernel run alone, so the
sum is device work without overlap. This prints every kernel in order with its class, then
the time per class, and (from the benchmark's JSON, if given) the fused or separate form
each product ran in.

usage: ncu_step_summary.py STEP.csv [BENCH.json]
"""
import csv
import json
import re
import sys

# Most specific first: a kernel's class is the first pattern its name matches.
CLASSES = [
    ("GEMM, GELU-aux epilogue (forward up product)", r"(nvjet|gemm).*geluaux"),
    ("GEMM, dGELU epilogue (backward)", r"(nvjet|gemm).*dgelu"),
    ("GEMM, other (bias, residual, accumulate, plain)", r"nvjet|xmma_gemm|gemm_"),
    ("cuBLASLt split-K reduction", r"splitKreduce"),
    ("cuBLASLt bias-gradient reduction", r"BgradAB"),
    ("fused AdamW (one per unit)", r"adamw"),
    ("global norm (sum of squares / exact passes)", r"sum_squares|max_abs|for_each_max"),
    ("separate bias adds", r"add_bias|[:\s]bias_kernel"),
    ("GELU / dGELU element-wise", r"gelu"),
    # cuDNN's fused attention (tessera-gpt --attention cudnn)
    ("attention backward (cuDNN: dO.O row dots, the kernel, dQ to bf16)", r"sdpa.*bprop|compute_dot_do_o|convert_dq_to"),
    ("attention forward (cuDNN)", r"sdpa.*fprop"),
    # PyTorch's (bench/torch_gpt2.py under torch.compile): its flash attention and Triton's fused kernels
    ("attention backward (PyTorch flash)", r"flash_bwd|flash::.*bwd|fmha.*bwd"),
    ("attention forward (PyTorch flash)", r"flash_fwd|flash::.*fwd|fmha.*fwd"),
    ("Triton fused kernels (torch.compile)", r"triton_"),
    # tessera-gpt's own kernels
    ("attention backward (flash, and its row dots)", r"flash::(backward_kernel|row_dot)|attention_backward"),
    ("attention forward (flash)", r"flash::forward_kernel|attention_forward"),
    ("LayerNorm backward", r"layernorm_backward"),
    ("LayerNorm forward", r"layernorm_kernel"),
    ("cross-entropy (loss and gradient in place)", r"cross_entropy"),
    ("dtype conversions", r"convert_kernel"),
    ("residual adds", r"kernels::add_kernel"),
]
OTHER = "embedding, one-hot, softmax + loss, fills, decisions"


def kernels(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    start = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    hdr = rows[start]
    name, value, metric = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Name")
    for r in rows[start + 1:]:
        if len(r) > value and r[metric] == "gpu__time_duration.sum":
            yield r[name], float(r[value].replace(",", "")) / 1000.0  # ns -> us


def classify(name):
    for label, pattern in CLASSES:
        if re.search(pattern, name, re.I):
            return label
    return OTHER


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    ks = list(kernels(sys.argv[1]))
    if not ks:
        sys.exit(f"tessera: no kernel durations in {sys.argv[1]} (was the NVTX range 'tessera-step' profiled?)")
    by = {}
    for n, us in ks:
        c = classify(n)
        print(f"{us:9.1f} us  {c[:28]:28s}  {n[:100]}")
        by.setdefault(c, []).append(us)
    total = sum(us for _, us in ks)
    print(f"\n| kernels of one step | launches | us | mean us | share |\n| --- | --- | --- | --- | --- |")
    for label in [c for c, _ in CLASSES] + [OTHER]:
        if label in by:
            v = by[label]
            print(f"| {label} | {len(v)} | {sum(v):.1f} | {sum(v) / len(v):.1f} | {sum(v) / total:.1%} |")
    print(f"| **sum** | {len(ks)} | **{total:.1f}** | | |")
    if len(sys.argv) > 2:
        # Not the step time: under ncu every kernel runs alone, so the benchmark's own timing
        # is inflated (several-fold at 34M). What it says that matters here is which form of
        # each fused product its first-step timing chose, since that decides the kernels above.
        with open(sys.argv[2]) as f:
            r = json.load(f)["results"][0]
        if r.get("fusion_choices"):
            print(f"\nfusion choices in this run: {r['fusion_choices']}")


if __name__ == "__main__":
    main()
