#!/usr/bin/env python3
"""The conversion tables between Tessera's tensors and Hugging Face's, read from
the models' own headers (models/include/<model>/hf_table.hpp: the JSON
between the raw string's delimiters), so that tessera-llama's and tessera-gpt's
--init-from, tools/hf_import.py and tools/hf_export.py read one table: a row
names a Tessera tensor and the Hugging Face tensors it is, stacked on dim 0,
transposed where Hugging Face keeps [in, out] ("transpose"), with zero rows past
theirs where Tessera pads a vocabulary ("pad_rows"), absent where a tied head is
the embedding ("untied")."""
import json
import os
import re

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = {'llama': 'tessera-llama', 'gpt2': 'tessera-gpt'}
HEADERS = {'llama': ('llama', 'llama'), 'gpt2': ('gpt', 'gpt')}  # model -> (folder, header namespace)


def table(model):
    """The model's table as parsed JSON (model: 'llama' or 'gpt2')."""
    folder, name = HEADERS[model]
    candidates = [os.path.join(HERE, '..', 'models', 'include', name, 'hf_table.hpp'),  # a source tree
                  os.path.join(HERE, '..', 'share', 'tessera', 'hf', name + '_hf_table.hpp')]  # an install
    for path in candidates:
        if os.path.exists(path):
            text = open(path, encoding='utf-8').read()
            m = re.search(r'R"json\((.*?)\)json"', text, re.S)
            if not m:
                raise ValueError(f'{path}: no R"json(...)json" table')
            return json.loads(m.group(1))
    raise ValueError(f'no conversion table for {model} (looked in {", ".join(candidates)})')


def rows(model, layers, tied):
    """The table's rows for `layers` blocks: (tessera name, [hf names], row)."""
    out = []
    for t in table(model)['tensors']:
        if tied and t.get('untied'):
            continue
        blocks = range(layers) if '{i}' in t['tessera'] else [None]
        for i in blocks:
            sub = (lambda s: s.replace('{i}', str(i))) if i is not None else (lambda s: s)
            out.append((sub(t['tessera']), [sub(h) for h in t['hf']], t))
    return out


def to_hf(model, weights, meta):
    """Tessera tensors (name -> array) as Hugging Face's: stacks split, transposes
    undone, padded rows dropped."""
    layers, vocab = int(meta['layers']), int(meta['vocab'])
    tied = str(meta.get('tie_embeddings', model == 'gpt2')).lower() in ('true', '1')
    splits = split_sizes(model, meta)
    hf = {}
    for name, names, t in rows(model, layers, tied):
        w = weights[name]
        if t.get('pad_rows'):
            w = w[:vocab]
        if t.get('transpose'):
            hf[names[0]] = np.ascontiguousarray(w.T)
            continue
        if len(names) == 1:
            hf[names[0]] = w
            continue
        sizes = splits[name.split('.')[-1]]
        at = 0
        for n, s in zip(names, sizes):
            hf[n] = w[at:at + s]
            at += s
    return hf


def split_sizes(model, meta):
    """Rows of each stacked part, per table row ('qkv', 'gate_up'), from a model's metadata."""
    if model == 'llama':
        hd, H, KV, F = int(meta['head_dim']), int(meta['heads']), int(meta['kv_heads']), int(meta['ffn'])
        return {'qkv': [H * hd, KV * hd, KV * hd], 'gate_up': [F, F]}
    return {}


def to_tessera(model, hf, meta):
    """Hugging Face tensors (name -> array) as Tessera's, padded as the trainer pads."""
    layers = int(meta['layers'])
    tied = str(meta.get('tie_embeddings', model == 'gpt2')).lower() in ('true', '1')
    padded = (int(meta['vocab']) + 127) // 128 * 128
    prefix = table(model).get('prefix', '')
    out = {}
    for name, names, t in rows(model, layers, tied):
        parts = []
        for n in names:
            a = hf[n] if n in hf else hf[n[len(prefix):]] if n.startswith(prefix) and n[len(prefix):] in hf else None
            if a is None:
                raise ValueError(f'no tensor {n} ({name} needs it)')
            parts.append(a.T if t.get('transpose') else a)
        w = np.concatenate(parts, 0) if len(parts) > 1 else parts[0]
        if t.get('pad_rows') and w.shape[0] < padded:
            w = np.concatenate([w, np.zeros((padded - w.shape[0],) + w.shape[1:], w.dtype)], 0)
        out[name] = w
    return out


def llama_meta(config):
    """A LlamaForCausalLM config.json as tessera-llama's metadata (the fields
    numpy_forward.py and the exporter read; tessera-llama's --init-from checks
    the configuration itself, llama/hf.hpp)."""
    rope = config.get('rope_parameters') or config.get('rope_scaling') or {}
    kind = rope.get('rope_type', rope.get('type', 'default'))
    heads = config['num_attention_heads']
    meta = {'layers': config['num_hidden_layers'], 'heads': heads,
            'kv_heads': config.get('num_key_value_heads') or heads, 'd': config['hidden_size'],
            'ffn': config['intermediate_size'], 'vocab': config['vocab_size'],
            'head_dim': config.get('head_dim') or config['hidden_size'] // heads,
            'rope_theta': rope.get('rope_theta', config.get('rope_theta', 10000.0)),
            'norm_eps': config.get('rms_norm_eps', 1e-6), 'tie_embeddings': bool(config.get('tie_word_embeddings')),
            'max_seq': config.get('max_position_embeddings', 0), 'rope_factor': 0}
    if kind == 'llama3':
        meta.update({'rope_factor': rope['factor'], 'rope_low_freq_factor': rope['low_freq_factor'],
                     'rope_high_freq_factor': rope['high_freq_factor'],
                     'rope_original_positions': rope['original_max_position_embeddings']})
    return meta


def llama_config(meta):
    """tessera-llama's metadata as a LlamaForCausalLM config.json (transformers 4's
    rope_theta and rope_scaling, which transformers 5 reads too)."""
    def val(k, default=None):
        v = meta.get(k, default)
        try:
            return json.loads(v) if isinstance(v, str) else v
        except ValueError:
            return v
    m = {k: val(k) for k in ('layers', 'heads', 'kv_heads', 'd', 'ffn', 'vocab', 'head_dim', 'max_seq', 'seq', 'norm_eps',
                             'rope_theta', 'tie_embeddings', 'rope_factor', 'rope_low_freq_factor',
                             'rope_high_freq_factor', 'rope_original_positions')}
    m['tie_embeddings'] = m['tie_embeddings'] in (True, 1, 'true', 'True')
    c = {'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'hidden_act': 'silu',
         'num_hidden_layers': m['layers'], 'num_attention_heads': m['heads'], 'num_key_value_heads': m['kv_heads'],
         'hidden_size': m['d'], 'intermediate_size': m['ffn'], 'vocab_size': m['vocab'], 'head_dim': m['head_dim'],
         'max_position_embeddings': m.get('max_seq') or m.get('seq'), 'rms_norm_eps': m['norm_eps'],
         'rope_theta': m['rope_theta'], 'tie_word_embeddings': bool(m['tie_embeddings']), 'attention_bias': False,
         'mlp_bias': False, 'attention_dropout': 0.0, 'initializer_range': 0.02, 'pretraining_tp': 1,
         'use_cache': True, 'torch_dtype': 'float32'}
    if float(m.get('rope_factor') or 0) > 0:
        c['rope_scaling'] = {'rope_type': 'llama3', 'factor': m['rope_factor'],
                             'low_freq_factor': m['rope_low_freq_factor'],
                             'high_freq_factor': m['rope_high_freq_factor'],
                             'original_max_position_embeddings': m['rope_original_positions']}
    return c
