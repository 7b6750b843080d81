#!/usr/bin/env python3
"""llm.c's GPT-2 trainer (train_gpt2cu), the other peer of tessera-gpt's speed, run the way the
speed issue's anchors were: random initialisation (-e d12 / d24 / d48), random tokens, bf16, seq
1024, its defaults otherwise (GELU recomputed in backward, cuDNN attention when it was built with
USE_CUDNN=1).

llm.c is never part of this repository: build it elsewhere from its public source and pass the
binary (bench/gpu/gpt.sh's speed part takes it from $TESSERA_GPT_LLMC). On CUDA 13 its source
needs one line removed first: the cudaMemAdvise call in the managed-memory fallback of
llmc/cuda_utils.cuh (CUDA 13 dropped that overload; the fallback only runs out of memory). Then
  make train_gpt2cu USE_CUDNN=1 NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY=90 \
       "NVCC_LDLIBS=-lnvrtc -lcuda"
with cuDNN frontend's headers in ./cudnn-frontend/include.

Prints one JSON line per step ({"step", "loss", "ms", "tokens_per_s"}) and a summary
({"summary": true, "llmc": true, "tokens_per_s", "peak_bytes"}) like bench/torch_gpt2.py, so
bench/gpt_speed_summary.py takes it as a peer. tokens/s: llm.c's own step times (CUDA events
around the training section, the validation loss outside them) of its steps 6 on, as numbered in
its output (from 1), the issue's steps 6-35. peak_bytes: the device memory in use once llm.c has
allocated everything (its own "device memory usage" line, from cudaMemGetInfo: the CUDA context
and cuBLAS/cuDNN workspaces included, unlike PyTorch's max_memory_allocated).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

DEPTH = {'gpt2': 'd12', 'gpt2-medium': 'd24', 'gpt2-large': 'd36', 'gpt2-xl': 'd48'}
STEP = re.compile(r'^step\s+(\d+)/(\d+) \| loss ([-\d.naif]+) .*\| ([\d.]+) ms \|')
MEMORY = re.compile(r'^device memory usage: (\d+) MiB')


def token_file(path, tokens, seed):
    """llm.c's token file: a 256-int32 header (magic 20240520, version 1, count), then uint16 tokens."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, tokens)
    data = np.random.default_rng(seed).integers(0, 50257, size=tokens, dtype=np.uint16)
    with open(path, 'wb') as f:
        f.write(header.tobytes())
        f.write(data.tobytes())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--llmc', required=True, help='the train_gpt2cu binary')
    p.add_argument('--model', default='gpt2', choices=sorted(DEPTH))
    p.add_argument('--batch', type=int, default=8)
    p.add_argument('--seq', type=int, default=1024)
    p.add_argument('--steps', type=int, default=30)
    a = p.parse_args()
    if not os.access(a.llmc, os.X_OK):
        sys.exit(f'tessera: llmc_gpt2: {a.llmc} is not an executable llm.c train_gpt2cu')
    with tempfile.TemporaryDirectory() as tmp:
        train, val = os.path.join(tmp, 'train.bin'), os.path.join(tmp, 'val.bin')
        # Enough tokens that no step sees the same batch twice (llm.c shuffles within an epoch).
        token_file(train, (a.steps + 2) * a.batch * a.seq + 1, 1)
        token_file(val, 2 * a.batch * a.seq + 1, 2)
        cmd = [os.path.abspath(a.llmc), '-e', DEPTH[a.model], '-b', str(a.batch), '-t', str(a.seq),
               '-x', str(a.steps), '-i', train, '-j', val, '-v', str(10 * a.steps), '-m', '1', '-s', '0',
               '-o', os.path.join(tmp, 'log')]
        # Run in tmp: llm.c looks for its tokenizer and eval files relative to the working folder (none here).
        r = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-4000:] + r.stderr[-4000:])
        sys.exit(f'tessera: llmc_gpt2: train_gpt2cu exited with {r.returncode}')
    times, peak = [], 0
    for line in r.stdout.splitlines():
        if m := MEMORY.match(line):
            peak = int(m.group(1)) * 2**20
        if m := STEP.match(line):
            step, loss, ms = int(m.group(1)), m.group(3), float(m.group(4))
            print(json.dumps({'step': step, 'loss': float(loss), 'ms': ms, 'tokens_per_s': a.batch * a.seq / ms * 1e3}),
                  flush=True)
            if step > 5:
                times.append(ms)
    if not times:
        sys.stderr.write(r.stdout[-4000:])
        sys.exit('tessera: llmc_gpt2: no step lines in llm.c\'s output (too few --steps?)')
    tps = a.batch * a.seq * len(times) / sum(times) * 1e3
    # The spread too: on an H200 llm.c's small-model steps once varied 75-120 ms from step to step.
    ordered = sorted(times)
    print(json.dumps({'summary': True, 'llmc': True, 'tokens_per_s': tps, 'peak_bytes': peak,
                      'model': a.model, 'batch': a.batch, 'steps_timed': len(times), 'min_ms': ordered[0],
                      'median_ms': ordered[len(ordered) // 2], 'max_ms': ordered[-1]}), flush=True)


if __name__ == '__main__':
    main()
