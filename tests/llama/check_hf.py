#!/usr/bin/env python3
"""tessera-llama's CUDA net against transformers' LlamaForCausalLM on a GPU, both
ways. In: random LlamaForCausalLM models (grouped kv heads, Llama 3's rotary
scaling, a tied and an untied head) saved by transformers in fp32 and bf16 are
taken in with --init-from; the trainer's validation loss at step 0 equals
transformers' (fp32 on the GPU) within 1e-5 relative in fp32 and 1e-2 in bf16.
Out: the trainer trains one of them for a few steps in bf16 on the GPU, dumps
its weights, tools/hf_export.py writes a directory, and transformers, loaded
from it alone, gives the loss numpy's float64 forward gives (1e-5).

Usage: check_hf.py TRAINER HF_EXPORT NUMPY_FORWARD"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

trainer, hf_export, numpy_forward = sys.argv[1:4]
sys.path.insert(0, os.path.dirname(os.path.abspath(numpy_forward)))
import numpy_forward as ref  # noqa: E402

tmp = tempfile.mkdtemp(prefix='tessera-llama-hf-')
V, T = 1000, 64
rng = np.random.default_rng(3)
toks = rng.integers(0, V, 20000).astype('<u4')
data = os.path.join(tmp, 'tokens.bin')
h = np.zeros(256, '<i4')
h[0], h[1], h[2] = 20240801, 7, len(toks)
open(data, 'wb').write(h.tobytes() + toks.tobytes())
windows = len(toks) - T
seqs = np.stack([toks[(i * T) % windows:(i * T) % windows + T + 1] for i in range(8)]).astype(np.int64)
failures = []


def hf_loss(directory, dtype=torch.float32):
    m = LlamaForCausalLM.from_pretrained(directory, dtype=dtype).cuda().eval()
    with torch.no_grad():
        s = torch.tensor(seqs).cuda()
        logits = m(s[:, :-1]).logits.float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), s[:, 1:].reshape(-1)).item()


def trainer_val(directory, precision, extra=()):
    cmd = [trainer, '--backend', 'cuda', '--json', '--init-from', directory, '--seq', str(T), '--batch', '4',
           '--steps', '0', '--data', data, '--val-data', data, '--val-batches', '2', '--precision', precision,
           '--dump-weights', os.path.join(tmp, 'init.st')] + list(extra)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
    return json.loads([l for l in out if '"summary"' in l][0])['val_loss']


for tied in (False, True):
    cfg = LlamaConfig(vocab_size=V, hidden_size=256, intermediate_size=640, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=500000.0,
                      rope_scaling={'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0,
                                    'high_freq_factor': 4.0, 'original_max_position_embeddings': 32},
                      tie_word_embeddings=tied)
    torch.manual_seed(1 + tied)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if 'norm' in n else 0.05))
    for dtype, tag in ((torch.float32, 'fp32'), (torch.bfloat16, 'bf16')):
        d = os.path.join(tmp, f'{"tied" if tied else "untied"}-{tag}')
        model.to(dtype).save_pretrained(d, safe_serialization=True)
        want = hf_loss(d)
        for precision, tol in (('fp32', 1e-5), ('bf16', 1e-2)):
            got = trainer_val(d, precision)
            rel = abs(got - want) / want
            ok = rel < tol
            print(f'{"ok  " if ok else "FAIL"} {os.path.basename(d)} --precision {precision}: tessera-llama {got:.7f}, '
                  f'transformers fp32 {want:.7f} (relative {rel:.1e}, tolerance {tol:.0e})', flush=True)
            if not ok:
                failures.append(f'{d} {precision}: {got} against {want}')

# Out: train on the GPU in bf16, export, load in transformers.
d = os.path.join(tmp, 'untied-bf16')
dump = os.path.join(tmp, 'trained.st')
subprocess.run([trainer, '--backend', 'cuda', '--init-from', d, '--seq', str(T), '--batch', '4', '--steps', '20',
                '--data', data, '--precision', 'bf16', '--lr', '1e-3', '--dump-weights', dump], check=True,
               capture_output=True)
out = os.path.join(tmp, 'exported')
subprocess.run([sys.executable, hf_export, dump, out], check=True, capture_output=True)
w, meta = ref.load(dump)
want = ref.loss(w, meta, seqs) / (8 * T)
got = hf_loss(out)
rel = abs(got - want) / want
print(f'{"ok  " if rel < 1e-5 else "FAIL"} trained on the GPU, exported: transformers {got:.7f}, numpy float64 {want:.7f} '
      f'(relative {rel:.1e})')
if rel >= 1e-5:
    failures.append(f'exported: {got} against {want}')
sys.exit('FAIL:\n' + '\n'.join(failures) if failures else 0)
