#!/usr/bin/env python3
"""The way out of Tessera: tessera-gpt trains a small GPT-2 on the GPU
(bf16), tools/hf_export.py writes its weights as a Hugging Face
GPT2LMHeadModel directory, and transformers' model, loaded from it alone,
gives the trainer's validation loss (its logits through cross-entropy on the
same windows) within bf16 rounding of the trainer's bf16 forward, and within
1e-5 of an fp32 forward of the same weights.

Usage: check_hf.py TRAINER EXPORT_HF TEXT"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import GPT2LMHeadModel

trainer, export_hf, text = sys.argv[1:4]
tmp = tempfile.mkdtemp(prefix='tessera-gpt-hf-')
dump = os.path.join(tmp, 'w.safetensors')
model = ['--layers', '2', '--heads', '4', '--d', '128', '--seq', '64', '--batch', '4', '--data', text, '--text',
         '--val-data', text, '--val-batches', '2', '--lr', '1e-3']
run = lambda args: json.loads(subprocess.run([trainer, '--backend', 'cuda', '--json'] + model + args, check=True,
                                             capture_output=True, text=True).stdout.splitlines()[-1])
bf16 = run(['--precision', 'bf16', '--steps', '20', '--dump-weights', dump])['val_loss']
# The dump holds the fp32 main weights; transformers reads them in fp32, checked against numpy's float64.
subprocess.run([sys.executable, export_hf, dump, os.path.join(tmp, 'hf')], check=True)
hf = GPT2LMHeadModel.from_pretrained(os.path.join(tmp, 'hf')).cuda().eval()
toks = np.frombuffer(open(text, 'rb').read(), dtype=np.uint8).astype(np.int64)
T = 64
windows = len(toks) - T
seqs = torch.tensor(np.stack([toks[(i * T) % windows:(i * T) % windows + T + 1] for i in range(8)])).cuda()
with torch.no_grad():
    logits = hf(seqs[:, :-1]).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), seqs[:, 1:].reshape(-1)).item()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'examples', 'gpt'))
import numpy_forward as ref
w, meta = ref.load(dump)
want = ref.loss(w, meta, seqs.cpu().numpy()) / (8 * T)
print(f'transformers GPT2LMHeadModel (fp32) {loss:.6f}; numpy float64 {want:.6f} (relative {abs(loss - want) / want:.1e}); '
      f'tessera-gpt bf16 forward {bf16:.6f} (relative {abs(loss - bf16) / loss:.1e})')
ok = abs(loss - want) / want < 1e-5 and abs(loss - bf16) / loss < 1e-2
sys.exit(0 if ok else 1)
