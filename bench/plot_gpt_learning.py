#!/usr/bin/env python3
"""tessera-gpt learning on real text: the training and validation loss of one
--json run (nats per byte with a byte vocabulary) beside the training text's
unigram entropy (what a model that ignores context reaches), and a verdict.

Usage: plot_gpt_learning.py RUN.json TRAIN_TEXT OUT.png
Prints the unigram entropy, the last validation loss and their ratio; exits
1 when the validation loss is not below 0.8 of the unigram entropy."""
import collections
import json
import math
import sys

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt

run, text, png = sys.argv[1:4]
data = open(text, 'rb').read()
counts = collections.Counter(data)
unigram = -sum(c / len(data) * math.log(c / len(data)) for c in counts.values())
steps, train, val_steps, val = [], [], [], []
summary = {}
for line in open(run):
    if not line.startswith('{'):
        continue
    j = json.loads(line)
    if j.get('summary'):
        summary = j
    elif 'step' in j:
        if 'loss' in j:
            steps.append(j['step'] + 1), train.append(j['loss'])
        if 'val_loss' in j:
            val_steps.append(j['step'] + 1), val.append(j['val_loss'])
if not val:
    sys.exit(f'{run}: no validation loss (run with --val-data and --val-every)')
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot(steps, train, label='training loss (each step\'s batch)', lw=1)
ax.plot(val_steps, val, 'o-', label='validation loss (held-out pages)', lw=1.5)
ax.axhline(unigram, color='gray', ls='--', label=f'unigram entropy of the training text ({unigram:.3f})')
ax.set_xlabel('step')
ax.set_ylabel('cross-entropy, nats per byte')
ax.set_title(f'tessera-gpt, {summary.get("params", 0) / 1e6:.1f}M parameters, {summary.get("precision", "")}, '
             f'{summary.get("tokens_per_s", 0) / 1e3:.0f}k tokens/s')
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()
fig.savefig(png, dpi=120)
ratio = val[-1] / unigram
print(f'unigram entropy {unigram:.4f} nats/byte ({len(data)} bytes); validation loss {val[-1]:.4f} after '
      f'{val_steps[-1]} steps ({ratio:.3f} of the unigram entropy); training loss {train[-1]:.4f}')
sys.exit(0 if ratio < 0.8 else 1)
