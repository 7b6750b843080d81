#!/usr/bin/env python3
"""tessera-llama end to end on the host, with no framework: Hugging Face
LlamaForCausalLM directories (written here with numpy: config.json and
safetensors, BF16 and F32, one file and sharded under an index, tied and
untied heads, grouped kv heads, Llama 3's rotary scaling) taken in with
--init-from at 1 and 3 ranks and several wrappers, whose validation loss at
step 0 equals the numpy float64 forward of the directory and of the trainer's
--dump-weights; tools/hf_export.py giving the directory's tensors back bit for
bit; tools/hf_import.py's checkpoint giving the same weights as --init-from;
training from an imported model on Llama 3 shards, and a resume; and every
kind of bad input (configurations Tessera does not compute, tensors missing,
extra, misshapen or of another dtype, a damaged file, a shard that lies)
refused with one 'tessera:' line, nothing trained.

Usage: check_llama.py MPIEXEC TRAINER NUMPY_FORWARD TOOLS_DIR"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

mpiexec, trainer, numpy_forward, tools = sys.argv[1:5]
trainer = os.path.abspath(trainer)
sys.path.insert(0, os.path.dirname(os.path.abspath(numpy_forward)))
import numpy_forward as ref  # noqa: E402

env = dict(os.environ, OPENBLAS_NUM_THREADS='1')
tmp = tempfile.mkdtemp(prefix='tessera-llama-')
failures = []
rng = np.random.default_rng(7)
L, D, H, KV, F, V, T = 2, 64, 4, 2, 96, 300, 16


def bf16_bytes(a):
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16).astype('<u2')


def write_st(path, tensors, dtype):
    header, blobs, at = {'__metadata__': {'format': 'pt'}}, [], 0
    for name, a in tensors.items():
        raw = bf16_bytes(a).tobytes() if dtype == 'BF16' else np.ascontiguousarray(a, '<f4').tobytes()
        header[name] = {'dtype': dtype, 'shape': list(a.shape), 'data_offsets': [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b' ' * (-len(text) % 8)
    with open(path, 'wb') as f:
        f.write(len(text).to_bytes(8, 'little') + text + b''.join(blobs))


def raw_tensors(path):
    """name -> (dtype, shape, bytes): what bit for bit means, at any dtype."""
    raw = open(path, 'rb').read()
    n = int.from_bytes(raw[:8], 'little')
    header = json.loads(raw[8:8 + n])
    header.pop('__metadata__', None)
    return {k: (e['dtype'], e['shape'], raw[8 + n + e['data_offsets'][0]:8 + n + e['data_offsets'][1]])
            for k, e in header.items()}


def hf_dir(name, tied, dtype='F32', shards=1, edit_config=None, edit_tensors=None):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    config = {'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'hidden_act': 'silu',
              'num_hidden_layers': L, 'hidden_size': D, 'num_attention_heads': H, 'num_key_value_heads': KV,
              'intermediate_size': F, 'vocab_size': V, 'max_position_embeddings': 64, 'rms_norm_eps': 1e-5,
              'rope_theta': 500000.0, 'tie_word_embeddings': tied, 'attention_bias': False, 'mlp_bias': False,
              'rope_scaling': {'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
                               'original_max_position_embeddings': 16}}
    hd = D // H
    w = {'model.embed_tokens.weight': rng.normal(0, 0.5, (V, D)), 'model.norm.weight': 1 + rng.normal(0, 0.1, D)}
    if not tied:
        w['lm_head.weight'] = rng.normal(0, 0.3, (V, D))
    for l in range(L):
        p = f'model.layers.{l}.'
        w.update({p + 'input_layernorm.weight': 1 + rng.normal(0, 0.1, D),
                  p + 'post_attention_layernorm.weight': 1 + rng.normal(0, 0.1, D),
                  p + 'self_attn.q_proj.weight': rng.normal(0, 0.2, (H * hd, D)),
                  p + 'self_attn.k_proj.weight': rng.normal(0, 0.2, (KV * hd, D)),
                  p + 'self_attn.v_proj.weight': rng.normal(0, 0.2, (KV * hd, D)),
                  p + 'self_attn.o_proj.weight': rng.normal(0, 0.2, (D, H * hd)),
                  p + 'mlp.gate_proj.weight': rng.normal(0, 0.2, (F, D)),
                  p + 'mlp.up_proj.weight': rng.normal(0, 0.2, (F, D)),
                  p + 'mlp.down_proj.weight': rng.normal(0, 0.2, (D, F))})
    w = {k: v.astype(np.float32) for k, v in w.items()}
    if edit_config:
        edit_config(config)
    if edit_tensors:
        edit_tensors(w)
    json.dump(config, open(os.path.join(d, 'config.json'), 'w'))
    names = list(w)
    if shards == 1:
        write_st(os.path.join(d, 'model.safetensors'), w, dtype)
    else:
        weight_map = {}
        for s in range(shards):
            part = names[s::shards]
            f = f'model-{s + 1:05d}-of-{shards:05d}.safetensors'
            write_st(os.path.join(d, f), {k: w[k] for k in part}, dtype)
            weight_map.update({k: f for k in part})
        json.dump({'metadata': {}, 'weight_map': weight_map}, open(os.path.join(d, 'model.safetensors.index.json'), 'w'))
    return d


def shard(path, tokens, magic=20240801, version=7, count=None, extra=b''):
    h = np.zeros(256, '<i4')
    h[0], h[1], h[2] = magic, version, len(tokens) if count is None else count
    open(path, 'wb').write(h.tobytes() + np.asarray(tokens, '<u4').tobytes() + extra)


def run(np_, args, check=True):
    cmd = [mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', str(np_), trainer, '--json'] + args
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp)
    if check and res.returncode != 0:
        sys.exit(f'{" ".join(cmd)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}')
    return res


def summary(res):
    return [json.loads(l) for l in res.stdout.splitlines() if l.startswith('{') and '"summary"' in l][0]


data = os.path.join(tmp, 'tokens.bin')
shard(data, rng.integers(0, V, 6000))
tokens = ref.read_shard(data)
windows = len(tokens) - T


def numpy_loss(weights, meta, sequences):
    seqs = np.stack([tokens[(i * T) % windows:(i * T) % windows + T + 1] for i in range(sequences)])
    return ref.loss(weights, meta, seqs) / (sequences * T)


# 1. In: the validation loss at step 0 equals numpy's on the directory and on the dump, at any layout.
base = ['--seq', str(T), '--steps', '0', '--data', data, '--val-data', data, '--val-batches', '2']
for name, tied, dtype, shards in [('untied-f32', False, 'F32', 1), ('tied-bf16', True, 'BF16', 1),
                                  ('untied-bf16-sharded', False, 'BF16', 3)]:
    d = hf_dir(name, tied, dtype, shards)
    w_hf, meta = ref.load(d)
    meta['seq'] = T
    for np_, flags in [(1, ['--wrapper', 'ddp', '--strategy', 'no_shard', '--batch', '6']),
                       (3, ['--wrapper', 'fsdp2', '--strategy', 'optim_grads_params', '--batch', '2']),
                       (3, ['--wrapper', 'fsdp', '--strategy', 'optim', '--batch', '2'])]:
        dump = os.path.join(tmp, f'{name}-np{np_}.safetensors')
        got = summary(run(np_, base + flags + ['--init-from', d, '--dump-weights', dump]))['val_loss']
        want = numpy_loss(w_hf, meta, 12)
        w_dump, meta_dump = ref.load(dump)
        from_dump = numpy_loss(w_dump, meta_dump, 12)
        rel = max(abs(got - want), abs(from_dump - want)) / want
        print(f'{"ok  " if rel < 1e-6 else "FAIL"} {name} np{np_} {flags[1]} {flags[3]}: trainer {got:.9f}, numpy of the '
              f'directory {want:.9f}, of the dump {from_dump:.9f} (relative {rel:.1e})')
        if rel >= 1e-6:
            failures.append(f'{name} np{np_}: {got} against {want} / {from_dump}')
    # 2. Out: the export gives the directory's tensors back, bit for bit, at its dtype.
    out = os.path.join(tmp, name + '-out')
    r = subprocess.run([sys.executable, os.path.join(tools, 'hf_export.py'), dump, out, '--dtype',
                        'bf16' if dtype == 'BF16' else 'fp32'], capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f'hf_export {dump}: {r.stderr}')
        continue
    a = {}
    for f in sorted(os.listdir(d)):
        if f.endswith('.safetensors'):
            a.update(raw_tensors(os.path.join(d, f)))
    b = raw_tensors(os.path.join(out, 'model.safetensors'))
    differ = sorted(set(a) ^ set(b)) + [k for k in a if k in b and a[k] != b[k]]
    print(f'{"ok  " if not differ else "FAIL"} {name}: exported {len(b)} tensors, {len(differ)} differ from the input')
    if differ:
        failures.append(f'{name}: the round trip changed {differ[:5]}')
    if json.load(open(os.path.join(out, 'config.json')))['tie_word_embeddings'] != tied:
        failures.append(f'{name}: the exported config.json says another tying')

# 3. Import: a checkpoint of the directory gives the same weights as --init-from; training from it learns and resumes.
d = os.path.join(tmp, 'tied-bf16')
ck = os.path.join(tmp, 'imported')
r = subprocess.run([sys.executable, os.path.join(tools, 'hf_import.py'), d, ck, '--trainer', trainer],
                   capture_output=True, text=True, env=dict(env, OMPI_ALLOW_RUN_AS_ROOT='1'))
shape = ['--layers', str(L), '--heads', str(H), '--kv-heads', str(KV), '--d', str(D), '--ffn', str(F), '--vocab', str(V),
         '--max-seq', '64', '--rope-theta', '500000', '--rope-factor', '8', '--rope-original-positions', '16',
         '--tie-embeddings']
if r.returncode != 0:
    failures.append(f'hf_import: {r.stderr}')
else:
    a_dump, b_dump = os.path.join(tmp, 'from-hf.st'), os.path.join(tmp, 'from-ckpt.st')
    run(2, base + ['--batch', '3', '--init-from', d, '--dump-weights', a_dump])
    run(2, base + shape + ['--batch', '3', '--init-from', ck, '--dump-weights', b_dump])
    same = open(a_dump, 'rb').read() == open(b_dump, 'rb').read()
    print(f'{"ok  " if same else "FAIL"} hf_import.py then --init-from the checkpoint: the weights of --init-from the directory')
    if not same:
        failures.append('the imported checkpoint holds other weights than --init-from the directory')
    walk = os.path.join(tmp, 'walk.bin')  # each token determines the next: a pattern to learn
    shard(walk, (np.arange(6000) * 7) % V)
    train = ['--seq', str(T), '--data', walk, '--batch', '2', '--lr', '1e-2', '--log-every', '1']
    full = run(2, train + ['--init-from', d, '--steps', '8'])
    losses = [json.loads(l)['loss'] for l in full.stdout.splitlines() if l.startswith('{"') and '"loss"' in l]
    saved = os.path.join(tmp, 'saved')
    run(2, train + ['--init-from', d, '--steps', '8', '--save', saved, '--save-every', '4'])
    step4 = os.path.join(saved, 'step-000000004')
    again = run(2, train + shape + ['--steps', '8', '--load', step4])  # the rest of the run, from its checkpoint
    rest = [json.loads(l)['loss'] for l in again.stdout.splitlines() if l.startswith('{"') and '"loss"' in l]
    print(f'{"ok  " if rest == losses[4:] else "FAIL"} saved at step 4 and resumed: the uninterrupted losses')
    if rest != losses[4:]:
        failures.append(f'the resumed run gave {rest}, the uninterrupted one {losses[4:]}')
    resumed = run(3, train + shape + ['--steps', '8', '--load', step4], check=False)  # another global batch
    print(f'{"ok  " if losses[-1] < losses[0] else "FAIL"} training from the directory: loss {losses[0]:.4f} -> {losses[-1]:.4f}')
    if not losses[-1] < losses[0]:
        failures.append(f'training from the imported model did not learn: {losses}')
    if resumed.returncode == 0 or 'global batches of 4 sequences' not in resumed.stderr:
        failures.append(f'a resume with another global batch was not refused: {resumed.stderr[-300:]}')

# 4. Bad input: one 'tessera:' line naming the problem, nothing trained.
bad_base = ['--seq', str(T), '--steps', '2', '--data', data, '--batch', '2']
cases = [
    ('bias', lambda c: c.update(attention_bias=True), None, "'attention_bias'"),
    ('yarn', lambda c: c['rope_scaling'].update(rope_type='yarn'), None, "'rope_scaling.rope_type'"),
    ('window', lambda c: c.update(sliding_window=4096), None, "'sliding_window'"),
    ('experts', lambda c: c.update(num_local_experts=8), None, "'num_local_experts'"),
    ('gelu', lambda c: c.update(hidden_act='gelu'), None, "'hidden_act'"),
    ('qwen', lambda c: c.update(model_type='qwen2'), None, "'model_type'"),
    ('kv3', lambda c: c.update(num_key_value_heads=3), None, '--kv-heads 3 does not divide --heads 4'),
    ('missing', None, lambda w: w.pop('model.layers.1.mlp.up_proj.weight'), "no tensor 'model.layers.1.mlp.up_proj.weight'"),
    ('extra', None, lambda w: w.update({'model.layers.0.self_attn.q_proj.bias': np.zeros(D, np.float32)}),
     "'model.layers.0.self_attn.q_proj.bias' is not part of this model"),
    ('shape', None, lambda w: w.update({'model.layers.0.mlp.down_proj.weight': np.zeros((D, F + 1), np.float32)}),
     'takes rows of 96'),
    ('config-lies', lambda c: c.update(intermediate_size=80), None, 'a configuration that does not match its weights'),
]
for name, edit_c, edit_t, want in cases:
    d = hf_dir('bad-' + name, False, 'F32', 1, edit_c, edit_t)
    res = run(2, bad_base + ['--init-from', d], check=False)
    lines = [l for l in res.stderr.splitlines() if l.startswith('tessera:')]
    ok = res.returncode != 0 and lines and want in lines[0] and '"step"' not in res.stdout
    print(f'{"ok  " if ok else "FAIL"} {name}: {lines[0] if lines else res.stderr.strip()[-200:]}')
    if not ok:
        failures.append(f'{name}: exit {res.returncode}, wanted "{want}" in {res.stderr[-400:]}')
# A damaged file, an index naming a file that is not there, a shard that lies, flags the directory sets.
d = hf_dir('damaged', False)
with open(os.path.join(d, 'model.safetensors'), 'r+b') as f:
    f.write((10 ** 12).to_bytes(8, 'little'))
d2 = hf_dir('no-shard-file', False, 'F32', 2)
os.remove(os.path.join(d2, 'model-00002-of-00002.safetensors'))
lies = os.path.join(tmp, 'lies.bin')
shard(lies, rng.integers(0, V, 500), count=600)
past = os.path.join(tmp, 'past.bin')
shard(past, [1, 2, 3] * 100 + [V + 5])
good = os.path.join(tmp, 'untied-f32')
for args, want in [(['--init-from', d], 'not a valid safetensors file'),
                   (['--init-from', d2], 'model-00002-of-00002.safetensors'),
                   (['--init-from', good, '--val-data', lies], 'its header promises 600 32-bit tokens'),
                   (['--init-from', good, '--data', past], f'token {V + 5} at position 300 is not below the vocabulary size {V}'),
                   (['--init-from', good, '--layers', '3'], 'sets the shape from its config.json; drop --layers'),
                   (['--init-from', good, '--load', good], 'give one of them')]:
    res = run(2, bad_base + args, check=False)
    lines = [l for l in (res.stderr or '').splitlines() if l.startswith('tessera:')]
    ok = res.returncode != 0 and lines and want in lines[0]
    print(f'{"ok  " if ok else "FAIL"} {" ".join(args[2:]) or args[1]}: {lines[0] if lines else res.stderr.strip()[-200:]}')
    if not ok:
        failures.append(f'{args}: exit {res.returncode}, wanted "{want}" in {res.stderr[-400:]}')

shutil.rmtree(tmp, ignore_errors=True)
if failures:
    sys.exit('FAIL:\n' + '\n'.join(failures))
print('all checks passed')
