#!/usr/bin/env python3
"""One line per run of bench/gpu/gpt.sh's speed part: tessera-gpt beside its peers.

usage: gpt_speed_summary.py TESSERA.json PEER.json...   (JSON lines; the last {"summary": true} of each;
a PEER that is tessera-gpt too is printed with its ratio but is not a peer)
Prints tokens/s, peak memory, MFU (6 params + 12 layers seq d FLOPs per token over 989 TFLOP/s dense
bf16, the H200's) and tessera-gpt's ratio to each peer and to the best of them.
"""
import json
import sys

PEAK_TFLOPS = 989.0


def summary(path):
    try:
        rows = [json.loads(line) for line in open(path) if line.startswith('{')]
    except OSError:
        return {}
    done = [r for r in rows if r.get('summary')]
    return done[-1] if done else {}


def per_gpu(s):
    """tokens/s per GPU: tessera-gpt reports the whole world's, bench/torch_gpt2.py --fsdp2 each GPU's."""
    tps = s.get('tokens_per_s', 0.0)
    return tps / s.get('world', 1) if 'backend' in s else tps


def name(s, path):
    n = s.get('world', 1)
    at = f' x{n} GPUs' if n > 1 else ''
    if 'backend' in s:
        return f"tessera-gpt {s.get('wrapper', '')}/{s.get('strategy', '')}{at} ({s.get('attention', '?').split(' (')[0]})"
    if s.get('llmc'):
        return 'llm.c (train_gpt2cu)'
    if s.get('fsdp2'):
        return f"PyTorch FSDP2{' + compile' if s.get('compile') else ''}{at}"
    return 'torch.compile' if s.get('compile') else 'PyTorch eager'


def mfu(s, flops_per_token):
    return flops_per_token * s.get('tokens_per_s', 0.0) / (PEAK_TFLOPS * 1e12) if flops_per_token else None


def main():
    t = summary(sys.argv[1])
    tt = per_gpu(t)
    # The same model on every side: tessera-gpt's FLOPs per token serve all.
    per_token = t.get('tflops', 0.0) * 1e12 / t['tokens_per_s'] if t.get('tokens_per_s') else 0.0
    best = 0.0
    for path in [sys.argv[1]] + sys.argv[2:]:
        s = summary(path)
        tps = per_gpu(s)
        m = mfu(s, per_token)
        line = f"  {name(s, path):48s} {tps:10.0f} tokens/s per GPU  peak {s.get('peak_bytes', 0) / 2**30:6.2f} GiB"
        if m is not None:
            line += f"  MFU {100 * m:5.1f}%"
        if path != sys.argv[1]:
            if 'backend' not in s:  # another tessera-gpt row (TESSERA_GPT_ALSO) is not a peer
                best = max(best, tps)
            line += f"  tessera / this {tt / tps if tps else 0:.3f}"
        print(line)
    if best:
        print(f"  tessera-gpt / best peer: {tt / best:.3f}")


if __name__ == '__main__':
    main()
