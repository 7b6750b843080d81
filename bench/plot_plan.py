#!/usr/bin/env python3
"""Chart of a tessera-plan sweep: predicted tokens/s per GPU against world size
(log scale), one line per configuration; hollow markers where it does not fit
the sweep's --gpu-memory.

Usage: plot_plan.py OUT.png SWEEP.json [SWEEP.json ...] (one panel per file)"""
import json
import sys

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt

out, paths = sys.argv[1], sys.argv[2:]
if not paths:
    sys.exit(__doc__)
fig, axes = plt.subplots(1, len(paths), figsize=(7.5 * len(paths), 5.2), squeeze=False)
for ax, path in zip(axes[0], paths):
    j = json.load(open(path))
    m = j['model']
    lines = {}
    for r in j['rows']:
        lines.setdefault(r['line'], []).append(r)
    for label, rows in lines.items():
        x = [r['gpus'] for r in rows]
        y = [r['tokens_per_s_per_gpu'] for r in rows]
        p = ax.plot(x, y, '-', label=label)[0]
        for r in rows:
            ax.plot(r['gpus'], r['tokens_per_s_per_gpu'], 'o', color=p.get_color(),
                    markerfacecolor=p.get_color() if r['fits'] else 'none')
    params = 8 * m['layers'] * m['d'] ** 2 / 1e9
    ax.set_title(f"{m['layers']} layers x d {m['d']} (~{params:.1f}B), {j['tokens_per_gpu']} tokens per GPU")
    ax.set_xscale('log', base=2)
    ax.set_xlabel('GPUs')
    ax.set_ylabel('predicted tokens/s per GPU')
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
fig.suptitle(f"tessera-plan sweep on '{j['topology']['name']}' (hollow: does not fit)", fontsize=10)
fig.tight_layout()
fig.savefig(out, dpi=110)
print(f'wrote {out}')
