#!/usr/bin/env python3
"""Charts of tessera-bench-train runs: tokens/s per GPU and peak memory per GPU
for every strategy and world size in the given outputs (the benchmark's text,
as gpu-check's multi stage collects it), beside reference lines.

Usage: plot_train.py OUT.png RUN.txt [--ref "label=value,..."] [--mem-ref "label=GiB,..."] [--wrappers fsdp,ddp,...]
(--wrappers: each run's wrapper in order, for outputs whose header does not name it)"""
import argparse
import re

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt

ap = argparse.ArgumentParser()
ap.add_argument('png')
ap.add_argument('runs', nargs='+')
ap.add_argument('--ref', default='', help='tokens/s lines, label=value,...')
ap.add_argument('--mem-ref', default='', help='memory lines in GiB, label=value,...')
ap.add_argument('--wrappers', default='', help='wrapper of each run, in order, where the header lacks it')
a = ap.parse_args()

rows = []  # (label, tokens/s per GPU, peak MiB)
given = [w for w in a.wrappers.split(',') if w]
block = -1
for path in a.runs:
    world, variant, wrapper = 1, '', 'fsdp'
    for line in open(path):
        m = re.match(r'# tessera-bench-train on .*?: (\d+) ranks? \([^)]*\)(?:, wrapper (\w+))?', line)
        if m:
            block += 1
            world, variant = int(m.group(1)), ''
            wrapper = m.group(2) or (given[block] if block < len(given) else 'fsdp')
            continue
        m = re.match(r'# (\d+) gather buffers, gradients reduced in (\w+)(, GELU outputs recomputed)?'
                     r'(, gradient shards in lent activations)?', line)
        if m:
            variant = ' ' + ', '.join(([f'{m.group(1)} gather buf.'] if m.group(1) != '2' else []) +
                                      ([f'{m.group(2)} reduction'] if m.group(2) != 'fp32' else []) +
                                      (['GELU recomputed'] if m.group(3) else []) +
                                      (['lent grad shards'] if m.group(4) else []))
            continue
        if line.startswith('# all-gathers on copy engines'):
            variant = (variant + ',' if variant.strip() else '') + ' CE gathers'
            continue
        f = line.split()
        if f and f[0] in ('no_shard', 'optim', 'optim_grads', 'optim_grads_params') and len(f) >= 10:
            label = f'{world} GPU{"s" if world > 1 else ""}: {"DDP " if wrapper == "ddp" else ""}{f[0]}{variant}'
            rows.append((label, float(f[2]), float(f[8])))
if not rows:
    raise SystemExit('no result rows in ' + ' '.join(a.runs))

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 0.45 * len(rows) + 2.5), sharey=True)
y = range(len(rows))
ax1.barh(y, [r[1] / 1e3 for r in rows], color='tab:blue')
ax1.set_yticks(list(y), [r[0] for r in rows])
ax1.invert_yaxis()
ax1.set_xlabel('thousand tokens/s per GPU')
for i, r in enumerate(rows):
    ax1.text(r[1] / 1e3, i, f' {r[1] / 1e3:.1f}k', va='center', fontsize=8)
ax2.barh(y, [r[2] / 1024 for r in rows], color='tab:orange')
ax2.set_xlabel('peak memory per GPU (GiB, library-counted)')
for i, r in enumerate(rows):
    ax2.text(r[2] / 1024, i, f' {r[2] / 1024:.1f}', va='center', fontsize=8)
for ax, spec, scale in ((ax1, a.ref, 1e3), (ax2, a.mem_ref, 1)):
    for k, item in enumerate(x for x in spec.split(',') if x):
        label, value = item.rsplit('=', 1)
        ax.axvline(float(value) / scale, linestyle='--', color=f'C{k + 2}', label=label)
    if spec:
        ax.legend(loc='upper center', bbox_to_anchor=(0.5, -0.08), ncol=3, fontsize=8)
fig.suptitle('tessera-bench-train, 1.07B reference model, 8192 tokens per GPU')
fig.tight_layout()
fig.savefig(a.png, dpi=110)
print('wrote', a.png)
