#!/usr/bin/env python3
"""tessera-export-hf: tessera-gpt's weights as a Hugging Face GPT2LMHeadModel
directory (config.json + model.safetensors), the way a user takes a model
trained with Tessera to inference.

  export_hf_gpt2.py WEIGHTS OUT_DIR

WEIGHTS is tessera-gpt's --dump-weights file, or a checkpoint (a directory with
index.json, or a --save root: the newest complete one), read and verified with
tools/tessera_checkpoint.py. Names map as: embed.wte -> transformer.wte.weight
(the real vocabulary's rows; lm_head.weight is tied to it), embed.wpe ->
transformer.wpe.weight, embed.ln_f -> transformer.ln_f, blockL.ln_1/ln_2 ->
transformer.h.L.ln_1/ln_2, blockL.qkv -> attn.c_attn, blockL.proj ->
attn.c_proj, blockL.fc -> mlp.c_fc, blockL.fc_proj -> mlp.c_proj; GPT-2's
Conv1D stores [in, out], so every matrix is transposed."""
import json
import os
import sys

import numpy as np


def read_dump(path):
    from safetensors import safe_open
    with safe_open(path, 'np') as f:
        return {name: f.get_tensor(name) for name in f.keys()}, f.metadata() or {}


def read_checkpoint(path):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tessera_checkpoint import Checkpoint
    ck = Checkpoint(path)
    extra = ck.index.get('extra', {})
    if extra.get('model') != 'tessera-gpt':
        raise ValueError(f'{ck.path}: not written by tessera-gpt')
    meta = {k: str(extra[k]) for k in ('layers', 'heads', 'd', 'vocab', 'max_seq')}
    return {name: np.asarray(ck.tensor(name), dtype=np.float32) for name in ck.names()}, meta


def export(weights, meta, out_dir):
    L, H, d, V = int(meta['layers']), int(meta['heads']), int(meta['d']), int(meta['vocab'])
    P = int(meta['max_seq'])
    hf = {'transformer.wte.weight': weights['embed.wte'][:V], 'transformer.wpe.weight': weights['embed.wpe'],
          'transformer.ln_f.weight': weights['embed.ln_f.w'], 'transformer.ln_f.bias': weights['embed.ln_f.b']}
    for l in range(L):
        w = lambda k: weights[f'block{l}.{k}']
        h = f'transformer.h.{l}.'
        hf.update({h + 'ln_1.weight': w('ln_1.w'), h + 'ln_1.bias': w('ln_1.b'),
                   h + 'attn.c_attn.weight': w('qkv.w').T, h + 'attn.c_attn.bias': w('qkv.b'),
                   h + 'attn.c_proj.weight': w('proj.w').T, h + 'attn.c_proj.bias': w('proj.b'),
                   h + 'ln_2.weight': w('ln_2.w'), h + 'ln_2.bias': w('ln_2.b'),
                   h + 'mlp.c_fc.weight': w('fc.w').T, h + 'mlp.c_fc.bias': w('fc.b'),
                   h + 'mlp.c_proj.weight': w('fc_proj.w').T, h + 'mlp.c_proj.bias': w('fc_proj.b')})
    os.makedirs(out_dir, exist_ok=True)
    from safetensors.numpy import save_file
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in hf.items()},
              os.path.join(out_dir, 'model.safetensors'), metadata={'format': 'pt'})
    config = {'architectures': ['GPT2LMHeadModel'], 'model_type': 'gpt2', 'vocab_size': V, 'n_positions': P,
              'n_ctx': P, 'n_embd': d, 'n_layer': L, 'n_head': H, 'n_inner': None,
              'activation_function': 'gelu_new', 'layer_norm_epsilon': 1e-5, 'resid_pdrop': 0.0,
              'embd_pdrop': 0.0, 'attn_pdrop': 0.0, 'tie_word_embeddings': True, 'torch_dtype': 'float32',
              # GPT-2's end-of-text token where the vocabulary has it; a byte-level vocabulary's last byte else
              'bos_token_id': min(50256, V - 1), 'eos_token_id': min(50256, V - 1)}
    with open(os.path.join(out_dir, 'config.json'), 'w') as f:
        json.dump(config, f, indent=2)


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    try:
        weights, meta = read_checkpoint(argv[1]) if os.path.isdir(argv[1]) else read_dump(argv[1])
        export(weights, meta, argv[2])
    except (OSError, ValueError, KeyError) as e:
        print(f'tessera: {argv[1]}: {e}', file=sys.stderr)
        return 2
    print(f'{argv[2]}: GPT2LMHeadModel with {meta["layers"]} layers, d {meta["d"]}, vocabulary {meta["vocab"]}')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
