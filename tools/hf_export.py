#!/usr/bin/env python3
"""tessera-hf-export: tessera-llama's or tessera-gpt's weights as a Hugging Face
directory (config.json + model.safetensors) that transformers' LlamaForCausalLM
or GPT2LMHeadModel loads, the way a user takes a model trained with Tessera to
inference or to the hub.

  hf_export.py WEIGHTS OUT_DIR [--dtype fp32|bf16|fp16]

WEIGHTS is a trainer's --dump-weights file, or a checkpoint (a directory with
index.json, or a --save root: the newest complete one), read and verified with
tools/tessera_checkpoint.py. Names, stacks, transposes and padding follow the
model's conversion table (tools/hf_tables.py reads the one the trainers' bridge
reads), so importing a directory and exporting it again gives its tensors back
bit for bit (at the dtype it had: --dtype). A tied head is left out, as
transformers saves it. Any failure is one 'tessera:' line and exit code 2."""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_tables  # noqa: E402

PROGRAMS = {'tessera-llama': 'llama', 'tessera-gpt': 'gpt2'}


def read_dump(path):
    from safetensors import safe_open
    with safe_open(path, 'np') as f:
        return {name: f.get_tensor(name) for name in f.keys()}, dict(f.metadata() or {})


def read_checkpoint(path):
    from tessera_checkpoint import Checkpoint
    ck = Checkpoint(path)
    extra = ck.index.get('extra', {})
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in extra.items()}
    if 'max_seq' not in meta and 'seq' in meta:
        meta['max_seq'] = meta['seq']
    return {name: np.asarray(ck.tensor(name), dtype=np.float32) for name in ck.names()}, meta


def gpt2_config(meta):
    V, P = int(meta['vocab']), int(meta['max_seq'])
    return {'architectures': ['GPT2LMHeadModel'], 'model_type': 'gpt2', 'vocab_size': V, 'n_positions': P,
            'n_ctx': P, 'n_embd': int(meta['d']), 'n_layer': int(meta['layers']), 'n_head': int(meta['heads']),
            'n_inner': None, 'activation_function': 'gelu_new', 'layer_norm_epsilon': 1e-5, 'resid_pdrop': 0.0,
            'embd_pdrop': 0.0, 'attn_pdrop': 0.0, 'tie_word_embeddings': True, 'torch_dtype': 'float32',
            # GPT-2's end-of-text token where the vocabulary has it; a byte-level vocabulary's last byte else
            'bos_token_id': min(50256, V - 1), 'eos_token_id': min(50256, V - 1)}


def to_dtype(a, dtype):
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == 'fp32':
        return a, 'F32', a.tobytes()
    if dtype == 'fp16':
        h = a.astype('<f2')
        return h, 'F16', h.tobytes()
    bits = a.view(np.uint32)
    rounded = ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16).astype('<u2')  # round to nearest even
    return rounded, 'BF16', rounded.tobytes()


def write_safetensors(path, tensors, dtype):
    header, blobs, at = {'__metadata__': {'format': 'pt'}}, [], 0
    for name in sorted(tensors):
        arr, tag, raw = to_dtype(tensors[name], dtype)
        header[name] = {'dtype': tag, 'shape': list(np.shape(tensors[name])), 'data_offsets': [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header, separators=(',', ':')).encode()
    text += b' ' * (-len(text) % 8)
    tmp = path + '.tmp'
    with open(tmp, 'wb') as f:
        f.write(len(text).to_bytes(8, 'little') + text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def export(weights, meta, out_dir, dtype):
    model = PROGRAMS.get(meta.get('model', ''))
    if model is None:
        raise ValueError(f"metadata names no model this exporter knows ({meta.get('model')!r}; "
                         f"it takes {', '.join(PROGRAMS)})")
    hf = hf_tables.to_hf(model, weights, meta)
    config = hf_tables.llama_config(meta) if model == 'llama' else gpt2_config(meta)
    config['torch_dtype'] = {'fp32': 'float32', 'bf16': 'bfloat16', 'fp16': 'float16'}[dtype]
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, 'model.safetensors'), hf, dtype)
    with open(os.path.join(out_dir, 'config.json'), 'w') as f:
        json.dump(config, f, indent=2)
    return model


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('weights')
    ap.add_argument('out_dir')
    ap.add_argument('--dtype', choices=['fp32', 'bf16', 'fp16'], default='fp32')
    a = ap.parse_args(argv[1:])
    try:
        weights, meta = read_checkpoint(a.weights) if os.path.isdir(a.weights) else read_dump(a.weights)
        model = export(weights, meta, a.out_dir, a.dtype)
    except Exception as e:  # a damaged input of any kind: one line, never a traceback
        msg = str(e).replace('\n', ' ')
        print(f'tessera: {a.weights}: {msg}' if not msg.startswith('tessera:') else msg, file=sys.stderr)
        return 2
    print(f'{a.out_dir}: {"LlamaForCausalLM" if model == "llama" else "GPT2LMHeadModel"} with {meta["layers"]} '
          f'layers, d {meta["d"]}, vocabulary {meta["vocab"]} ({a.dtype})')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
