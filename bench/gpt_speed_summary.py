#!/usr/bin/env python3
"""One line per run of bench/gpu/gpt.sh's speed part: tessera-gpt beside its peers.

usage: gpt_speed_summary.py TESSERA.json PEER.json...   (JSON lines; the last {"summary": true} of each)
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


def name(s, path):
    if 'backend' in s:
        return 'tessera-gpt (attention ' + s.get('attention', '?') + ')'
    return 'torch.compile' if s.get('compile') else 'PyTorch eager'


def mfu(s, flops_per_token):
    return flops_per_token * s.get('tokens_per_s', 0.0) / (PEAK_TFLOPS * 1e12) if flops_per_token else None


def main():
    t = summary(sys.argv[1])
    tt = t.get('tokens_per_s', 0.0)
    # The same model on every side: tessera-gpt's FLOPs per token serve all.
    per_token = t.get('tflops', 0.0) * 1e12 / tt if tt else 0.0
    best = 0.0
    for path in [sys.argv[1]] + sys.argv[2:]:
        s = summary(path)
        tps = s.get('tokens_per_s', 0.0)
        m = mfu(s, per_token)
        line = f"  {name(s, path):40s} {tps:10.0f} tokens/s  peak {s.get('peak_bytes', 0) / 2**30:6.2f} GiB"
        if m is not None:
            line += f"  MFU {100 * m:5.1f}%"
        if path != sys.argv[1]:
            best = max(best, tps)
            line += f"  tessera / this {tt / tps if tps else 0:.3f}"
        print(line)
    if best:
        print(f"  tessera-gpt / best peer: {tt / best:.3f}")


if __name__ == '__main__':
    main()
