#!/usr/bin/env python3
"""Summarises an Nsight Compute CSV of one training step (gpu-check stages `profile` and `gpt`).

ncu --nvtx --nvtx-include "tessera-step/" --metrics gpu__time_duration.sum --csv times each
kernel of the step alone, at the clocks of a kernel run alone, so the sum is device work
without overlap. This prints every kernel in order with its class, then the time per class,
and (from the benchmark's JSON, if given) the fused or separate form each product ran in.

With the DRAM metrics too (--metrics gpu__time_duration.sum,dram__bytes_read.sum,
dram__bytes_write.sum) and --copy-gbs G (the device copy's read + write GB/s, measured in the
same call), each class also gets the bytes it moved, their time at copy speed and how many
times that its kernels took, and the schedule's floor: the GEMM and attention kernels (bound
by arithmetic) as measured, every other kernel's bytes at copy speed. The floor is this
schedule's (what its kernels must move), not the model's least traffic.

usage: ncu_step_summary.py STEP.csv [BENCH.json] [--copy-gbs G]
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
    ("LayerNorm forward", r"layernorm_kernel|layernorm_rows_kernel"),  # the registers form (D up to 2048)
    ("cross-entropy (loss and gradient in place)", r"cross_entropy"),
    ("dtype conversions", r"convert_kernel"),
    ("residual adds", r"kernels::add_kernel"),
]
OTHER = "embedding, one-hot, softmax + loss, fills, decisions"


# Classes bound by arithmetic, not by memory: the floor takes them as measured.
COMPUTE = re.compile(r"^(GEMM|cuBLASLt split-K|attention)")
# ncu's units (it scales them unless --print-units base): times to us, bytes to bytes.
UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "second": 1e6,
         "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


def kernels(path):
    """Yields (name, us, bytes or None) per kernel, in launch order."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    start = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    hdr = rows[start]
    kid, name, value, metric = hdr.index("ID"), hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Name")
    unit = hdr.index("Metric Unit")
    order, got = [], {}
    for r in rows[start + 1:]:
        if len(r) <= value or r[kid] == "ID":
            continue
        if r[kid] not in got:
            order.append(r[kid])
            got[r[kid]] = {"name": r[name]}
        if r[unit] not in UNITS:
            sys.exit(f"tessera: {path}: unit '{r[unit]}' of {r[metric]} is not one this summary converts")
        got[r[kid]][r[metric]] = float(r[value].replace(",", "")) * UNITS[r[unit]]
    for k in order:
        m = got[k]
        if "gpu__time_duration.sum" not in m:
            continue
        moved = None
        if "dram__bytes_read.sum" in m and "dram__bytes_write.sum" in m:
            moved = m["dram__bytes_read.sum"] + m["dram__bytes_write.sum"]
        yield m["name"], m["gpu__time_duration.sum"], moved


def classify(name):
    for label, pattern in CLASSES:
        if re.search(pattern, name, re.I):
            return label
    return OTHER


def main():
    args = sys.argv[1:]
    copy_gbs = None
    if "--copy-gbs" in args:
        i = args.index("--copy-gbs")
        try:
            copy_gbs = float(args[i + 1])
        except (IndexError, ValueError):
            sys.exit(f"tessera: --copy-gbs needs the device copy's GB/s (a number), got "
                     f"{args[i + 1] if i + 1 < len(args) else 'nothing'}")
        if not copy_gbs > 0:
            sys.exit(f"tessera: --copy-gbs {args[i + 1]} is not a positive speed")
        del args[i:i + 2]
    if not args:
        sys.exit(__doc__)
    ks = list(kernels(args[0]))
    if not ks:
        sys.exit(f"tessera: no kernel durations in {args[0]} (was the NVTX range 'tessera-step' profiled?)")
    with_bytes = copy_gbs is not None and all(b is not None for _, _, b in ks)
    by = {}
    for n, us, b in ks:
        c = classify(n)
        print(f"{us:9.1f} us  {c[:28]:28s}  {n[:100]}")
        by.setdefault(c, []).append((us, b))
    total = sum(us for _, us, _ in ks)
    if with_bytes:
        print(f"\n| kernels of one step | launches | us | mean us | share | MB moved | us at copy speed | x its bytes |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    else:
        print(f"\n| kernels of one step | launches | us | mean us | share |\n| --- | --- | --- | --- | --- |")
    floor = compute = 0.0  # the schedule's floor; its GEMM and attention part
    for label in [c for c, _ in CLASSES] + [OTHER]:
        if label not in by:
            continue
        v = by[label]
        t = sum(us for us, _ in v)
        row = f"| {label} | {len(v)} | {t:.1f} | {t / len(v):.1f} | {t / total:.1%} |"
        if with_bytes:
            moved = sum(b for _, b in v)
            ideal = moved / (copy_gbs * 1e3)  # bytes -> us at copy_gbs GB/s
            arithmetic = bool(COMPUTE.match(label))
            bound = "arithmetic" if arithmetic else f"{t / ideal:.2f}" if ideal > 0 else "no DRAM traffic"
            row += f" {moved / 1e6:.1f} | {ideal:.1f} | {bound} |"
            compute += t if arithmetic else 0.0
            floor += t if arithmetic else min(t, ideal)
        print(row)
    print(f"| **sum** | {len(ks)} | **{total:.1f}** | | |" + (" | | |" if with_bytes else ""))
    if with_bytes:
        print(f"\nfloor of this schedule: GEMM and attention kernels as measured {compute:.1f} us + every other "
              f"kernel's DRAM bytes at {copy_gbs:.0f} GB/s {floor - compute:.1f} us = {floor:.1f} us; "
              f"the step's kernels sum to {total:.1f} us ({floor / total:.1%} of it is the floor)")
    if len(args) > 1:
        # Not the step time: under ncu every kernel runs alone, so the benchmark's own timing
        # is inflated (several-fold at 34M). What it says that matters here is which form of
        # each fused product its first-step timing chose, since that decides the kernels above.
        with open(args[1]) as f:
            r = json.load(f)["results"][0]
        if r.get("fusion_choices"):
            print(f"\nfusion choices in this run: {r['fusion_choices']}")


if __name__ == "__main__":
    main()
