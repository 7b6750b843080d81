#!/usr/bin/env python3
"""The independent reader (tools/tessera_checkpoint.py, written from
docs/checkpoint-format.md) against checkpoints the C++ side wrote: at several
world sizes, strategies, wrappers and a mesh, its tensors equal
tessera-consolidate's bit for bit and every checksum verifies; on damage
(a flipped data byte, a cut file, an edited index, an unknown version) it
refuses, as the C++ consolidation does.

Usage: python_reader.py MPIEXEC TRAINER CONSOLIDATE READER"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file

mpiexec, trainer, consolidate, reader = sys.argv[1:5]
sys.path.insert(0, os.path.dirname(os.path.abspath(reader)))
import tessera_checkpoint as tc  # noqa: E402

common = ['--layers', '2', '--d', '16', '--ctx', '4', '--tokens', '96', '--steps', '3']
runs = [('3', ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params']),
        ('2', ['--wrapper', 'fsdp2', '--strategy', 'optim_grads_params', '--precision', 'bf16']),
        ('4', ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--shard-group', '2', '--outer', 'optim']),
        ('1', ['--wrapper', 'ddp', '--strategy', 'no_shard'])]
work = tempfile.mkdtemp(prefix='tessera-pyreader-')
failed = False


def check(ok, what):
    global failed
    print(f'{"ok  " if ok else "FAIL"} {what}')
    failed |= not ok


def refuses(ckpt, what):
    """Both readers refuse the checkpoint."""
    try:
        tc.Checkpoint(ckpt).verify()
        py = None
    except tc.CheckpointError as e:
        py = str(e)
    cpp = subprocess.run([consolidate, ckpt, os.path.join(work, 'x.safetensors')], capture_output=True, text=True)
    check(py is not None and cpp.returncode != 0,
          f'{what}: python reader refuses ({py}); tessera-consolidate exits {cpp.returncode} ({cpp.stderr.strip()[:160]})')


try:
    for np_, flags in runs:
        root = os.path.join(work, f'ck-{np_}-{"-".join(f.strip("-") for f in flags[1::2])}')
        res = subprocess.run([mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', np_, trainer] + common + flags +
                             ['--save', root], capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            sys.exit(f'FAIL trainer {np_} {flags}: {res.stderr[-2000:]}')
        ref = os.path.join(work, 'ref.safetensors')
        subprocess.run([consolidate, root, ref, '--with-optimizer-state'], check=True, capture_output=True)
        ck = tc.Checkpoint(root)
        ck.verify()
        got = ck.export(os.path.join(work, 'py.safetensors'), with_optimizer_state=True)
        want = load_file(ref)
        same = set(got) == set(want) and all(got[k].shape == want[k].shape and got[k].tobytes() == want[k].tobytes()
                                             for k in want)
        check(same, f'{np_} rank(s) {" ".join(flags)}: {len(want)} tensors equal tessera-consolidate bit for bit, '
                    f'every checksum verified ({len(ck.files)} file(s), world {ck.index["world"]})')

    # Damage, on a copy of the last checkpoint each time.
    src = tc.resolve(root)

    def copy():
        d = os.path.join(work, 'damaged')
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        return d, json.load(open(os.path.join(d, 'index.json')))

    d, x = copy()
    t = x['tensors']['block0.w1']['pieces'][0]['ranges'][0]
    f = os.path.join(d, x['files'][x['tensors']['block0.w1']['pieces'][0]['file']]['name'])
    with open(f, 'r+b') as fh:
        fh.seek(t['offset'] + 5)
        b = fh.read(1)
        fh.seek(t['offset'] + 5)
        fh.write(bytes([b[0] ^ 0x10]))
    refuses(d, 'a flipped bit in a tensor')
    d, x = copy()
    f = os.path.join(d, x['files'][0]['name'])
    os.truncate(f, os.path.getsize(f) - 3)
    refuses(d, 'a rank file cut short')
    d, x = copy()
    x['step'] += 1
    json.dump(x, open(os.path.join(d, 'index.json'), 'w'))
    refuses(d, 'an edited index (the step changed, checksum kept)')
    d, x = copy()
    x.pop('index_checksum')
    x['version'] = 2
    x['index_checksum'] = tc._hex(tc.checksum64(tc._canonical(x)))
    json.dump(x, open(os.path.join(d, 'index.json'), 'w'))
    refuses(d, 'an unknown format version (with a valid index checksum)')
    d, x = copy()
    x.pop('index_checksum')
    name = sorted(x['tensors'])[0]
    x['tensors'][name]['shape'] = list(reversed(x['tensors'][name]['shape']))  # valid structure, wrong tensor
    json.dump(x, open(os.path.join(d, 'index.json'), 'w'))
    refuses(d, 'an index without its index_checksum (a shape transposed)')
    d, x = copy()
    x['version'] = 2  # the checksum left as it was: the version is named first
    json.dump(x, open(os.path.join(d, 'index.json'), 'w'))
    try:
        tc.Checkpoint(d)
        check(False, 'a version-2 index with a stale checksum is refused')
    except tc.CheckpointError as e:
        check('index version 2' in str(e), f'the Python reader names a version-2 index by its version ({e})')
    cpp = subprocess.run([consolidate, d, os.path.join(work, 'x.safetensors')], capture_output=True, text=True)
    check(cpp.returncode != 0 and 'index version 2' in cpp.stderr,
          f'tessera-consolidate names a version-2 index by its version ({cpp.stderr.strip()[:200]})')
    # A rank file's header metadata changed in place (same length, same offsets): both readers refuse it.
    d, x = copy()
    f = os.path.join(d, x['files'][0]['name'])
    data = open(f, 'rb').read()
    step = str(x['step']).encode()
    other = str((x['step'] + 1) % 10 ** len(step)).zfill(len(step)).encode()  # another step, same length
    open(f, 'wb').write(data.replace(b'"step":"' + step + b'"', b'"step":"' + other + b'"', 1))
    refuses(d, "a rank file's header metadata (step) changed")
    # A step-N directory holding another step's index (moved or copied by hand) is not taken for step N.
    moved = os.path.join(work, 'moved')
    shutil.rmtree(moved, ignore_errors=True)
    shutil.copytree(src, os.path.join(moved, 'step-%09d' % (json.load(open(os.path.join(src, 'index.json')))['step'] + 7)))
    refuses(moved, 'a step directory holding another step\'s index')
    # Malformed indexes (checksum recomputed, so only the structure is wrong): one message each, no traceback.
    for what, edit in [('tensors as a list', lambda x: x.__setitem__('tensors', [])),
                       ('files as a number', lambda x: x.__setitem__('files', 3)),
                       ('a piece without ranges', lambda x: next(iter(x['tensors'].values()))['pieces'][0].pop('ranges')),
                       ('a shape of strings', lambda x: next(iter(x['tensors'].values())).__setitem__('shape', ['a'])),
                       ('states as a number', lambda x: x.__setitem__('states', 5))]:
        d, x = copy()
        x.pop('index_checksum')
        edit(x)
        x['index_checksum'] = tc._hex(tc.checksum64(tc._canonical(x)))
        json.dump(x, open(os.path.join(d, 'index.json'), 'w'))
        try:
            tc.Checkpoint(d)
            check(False, f'a malformed index ({what}) is refused')
        except tc.CheckpointError as e:
            check(True, f'a malformed index ({what}): {str(e)[-90:]}')
        except Exception as e:  # noqa: BLE001 - what the test is about
            check(False, f'a malformed index ({what}) ends in a traceback: {type(e).__name__}: {e}')
    d, _ = copy()
    with open(os.path.join(d, 'index.json'), 'w') as f:
        f.write('[' * 100000 + ']' * 100000)
    try:
        tc.Checkpoint(d)
        check(False, 'a deeply nested index is refused')
    except tc.CheckpointError:
        check(True, 'a deeply nested index: one message')
    # The checksum's test vectors from the spec.
    vectors = {b'': '77f510d092b3e443', b'abc': '3dae02d52bfc73b6', bytes(range(100)): 'd6f0374caac6fcaa',
               b'The quick brown fox jumps over the lazy dog': 'a070861527ced667'}
    check(all(tc._hex(tc.checksum64(k)) == v for k, v in vectors.items()), 'checksum64 test vectors of the spec')
finally:
    shutil.rmtree(work, ignore_errors=True)
sys.exit(1 if failed else 0)
