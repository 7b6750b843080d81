#!/usr/bin/env python3
"""Turns tessera-collectives JSON files into PNG charts: bus bandwidth against
size, one line per implementation (and placement), one chart per operation.

Usage: plot_collectives.py OUT_PREFIX RUN.json [RUN.json ...]
Writes OUT_PREFIX-<op>.png for every operation found; each JSON file's lines
are labelled with its communicator and world size."""
import json
import sys

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

prefix, files = sys.argv[1], sys.argv[2:]
if not files:
    sys.exit(__doc__)
series = {}  # op -> label -> [(bytes, busbw)]
for path in files:
    with open(path) as f:
        run = json.load(f)
    tag = f"{run['comm']} x{run['world']}"
    for r in run['rows']:
        label = f"{r['impl']} {r['placement']} ({r['type']}, {tag})"
        series.setdefault(r['op'], {}).setdefault(label, []).append((r['bytes'], r['busbw_gbs'], r['algbw_gbs']))
for op, lines in sorted(series.items()):
    fig, ax = plt.subplots(figsize=(8, 5))
    # At world size 1 bus bandwidth is 0 by definition: plot algorithm bandwidth instead.
    use_alg = all(all(p[1] == 0 for p in pts) for pts in lines.values())
    for label, pts in sorted(lines.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[2] if use_alg else p[1] for p in pts], marker='o', ms=3, label=label)
    ax.set_xscale('log', base=2)
    ax.set_yscale('log')
    ax.set_xlabel('size (bytes)')
    ax.set_ylabel(('algorithm' if use_alg else 'bus') + ' bandwidth (GB/s)')
    ax.set_title(f'tessera-collectives: {op}')
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = f'{prefix}-{op}.png'
    fig.savefig(out, dpi=110)
    print(out)
