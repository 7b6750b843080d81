#!/usr/bin/env python3
"""Checkpoints through the reference trainer, on the host backend:

  resume       train 2k steps = train k, save, load, train k (same world and
               strategy): every logged loss and every final weight bit-identical
  reshard      save at 4 ranks with optim_grads_params, load at 3 ranks with
               optim (ddp) and at 1 rank with no_shard: the continued loss
               curve matches the uninterrupted one within fp32 rounding
  safetensors  Python's safetensors opens every rank file and the file
               tessera-consolidate writes; the consolidated tensors equal the
               trained weights, and each rank file's pieces equal their slices
  damage       a missing file, a truncated file, a flipped byte, a broken
               index, a tensor the model lacks, a tensor the checkpoint lacks,
               a shape that differs, a file or range checksum edited under a
               re-signed index, a rank file's header metadata changed: each a
               one-line tessera: error naming the file or tensor, while the
               previous checkpoint still loads
  crash        a process killed at each point of a save leaves the last good
               checkpoint loadable and nothing that looks complete
  keep         --keep K leaves the newest K checkpoints
  claim        a second job saving into a directory another job claimed
               fails at its start; leftovers of killed saves are removed

Usage: check_checkpoints.py MPIEXEC TRAINER CONSOLIDATE [TRAINER FLAGS...]
(e.g. '--backend cuda --precision fp32' for the device path, staged through host memory)"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from safetensors.numpy import load_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'tools'))
from tessera_checkpoint import checksum64, _canonical, _hex  # noqa: E402  (the spec's checksum, one implementation)

mpiexec, trainer, consolidate = sys.argv[1:4]
backend_flags = sys.argv[4:]
env = dict(os.environ, OPENBLAS_NUM_THREADS='1')
MODEL = ['--layers', '2', '--d', '24', '--ctx', '4', '--tokens', '96', '--log-every', '1', '--warmup', '2',
         '--lr', '3e-3'] + backend_flags
failures = []


def run(np_, flags, expect_ok=True, extra_env=None):
    cmd = [mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', str(np_), trainer, '--json'] + MODEL + flags
    res = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, **(extra_env or {})), timeout=300)
    if expect_ok and res.returncode != 0:
        sys.exit(f'{" ".join(cmd)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}')
    steps = {}
    for line in res.stdout.splitlines():
        if line.startswith('{') and '"summary"' not in line:
            j = json.loads(line)
            steps[j['step']] = j['loss']
    return res, steps


def check(name, ok, detail=''):
    print(f'{"ok  " if ok else "FAIL"} {name}{": " + detail if detail else ""}', flush=True)
    if not ok:
        failures.append(name)


def tensors(path):
    return load_file(path)


work = tempfile.mkdtemp(prefix='tessera-ckpt-')
try:
    # ---- resume: bit-identical ----
    _, ref = run(2, ['--steps', '8', '--strategy', 'optim_grads_params', '--dump-weights', f'{work}/ref.safetensors'])
    run(2, ['--steps', '4', '--strategy', 'optim_grads_params', '--save', f'{work}/a'])
    _, res = run(2, ['--steps', '8', '--strategy', 'optim_grads_params', '--load', f'{work}/a',
                     '--dump-weights', f'{work}/res.safetensors'])
    same_losses = all(res.get(s) == ref[s] for s in range(4, 8)) and min(res) == 4
    check('resume at the same world size and strategy: losses bit-identical', same_losses, f'{ref} vs {res}')
    with open(f'{work}/ref.safetensors', 'rb') as f1, open(f'{work}/res.safetensors', 'rb') as f2:
        check('resume: final weights bit-identical', f1.read() == f2.read())

    # ---- reshard: 4 ranks ZeRO-3 -> 3 ranks ZeRO-1 (ddp) and 1 rank no_shard ----
    _, ref4 = run(4, ['--steps', '8', '--strategy', 'optim_grads_params', '--dump-weights', f'{work}/ref4.safetensors'])
    run(4, ['--steps', '4', '--strategy', 'optim_grads_params', '--save', f'{work}/b'])
    for np_, flags in ((3, ['--wrapper', 'ddp', '--strategy', 'optim']), (1, ['--strategy', 'no_shard'])):
        _, cont = run(np_, ['--steps', '8', '--load', f'{work}/b', '--dump-weights', f'{work}/r{np_}.safetensors'] + flags)
        worst = max(abs(cont[s] - ref4[s]) / abs(ref4[s]) for s in range(4, 8))
        check(f'reshard 4 ranks optim_grads_params -> {np_} rank(s) {flags[-1]}: loss curve', worst <= 1e-5,
              f'worst relative difference {worst:.2e}')
        a, b = tensors(f'{work}/ref4.safetensors'), tensors(f'{work}/r{np_}.safetensors')
        wd = max(float(np.max(np.abs(a[k] - b[k]) / np.maximum(1.0, np.abs(a[k])))) for k in a)
        check(f'reshard -> {np_}: final weights within fp32 rounding', set(a) == set(b) and wd <= 1e-5, f'{wd:.2e}')

    # ---- safetensors: every file opens; consolidation equals the weights ----
    ck = f'{work}/b/step-000000004'
    _, _ = run(4, ['--steps', '4', '--strategy', 'optim_grads_params', '--dump-weights', f'{work}/w4.safetensors'])
    out = subprocess.run([consolidate, f'{work}/b', f'{work}/full.safetensors', '--with-optimizer-state'],
                         capture_output=True, text=True)
    check('tessera-consolidate runs', out.returncode == 0, out.stderr.strip())
    full, w4 = tensors(f'{work}/full.safetensors'), tensors(f'{work}/w4.safetensors')
    check('consolidated weights equal the trained weights (bit-identical)',
          all(np.array_equal(full[k], w4[k]) for k in w4), f'{sorted(w4)}')
    check('consolidated file holds the optimizer state too', any(k.endswith('/exp_avg_sq') for k in full))
    index = json.load(open(f'{ck}/index.json'))
    ok = True
    for f in index['files']:
        shard = tensors(f'{ck}/{f["name"]}')
        for name, t in index['tensors'].items():
            for p in t['pieces']:
                if index['files'][p['file']]['name'] != f['name']:
                    continue
                for r in p['ranges']:
                    state = r['key'].split('/')[-1]
                    whole = full[name if state == 'main' else f'{name}/{state}'].reshape(-1)
                    ok = ok and np.array_equal(shard[r['key']], whole[p['begin']:p['begin'] + p['count']])
    check('every rank file opens with safetensors and its pieces equal the consolidated tensors', ok)

    # ---- damage: each a tessera: error; the previous checkpoint still loads ----
    run(2, ['--steps', '4', '--save', f'{work}/c', '--save-every', '2'])
    good, newest = f'{work}/c/step-000000002', f'{work}/c/step-000000004'

    def damaged(name, mutate, expect, flags=()):
        d = f'{work}/damaged'
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(newest, d)
        mutate(d)
        res, _ = run(2, ['--steps', '6', '--load', d] + list(flags), expect_ok=False)
        lines = [l for l in res.stderr.splitlines() if l.startswith('tessera:')]
        check(f'damage: {name}', res.returncode != 0 and any(expect in l for l in lines),
              (lines[0] if lines else res.stderr.strip()[-300:]))

    rank1 = 'rank-00001-of-00002.safetensors'
    damaged('missing file', lambda d: os.remove(f'{d}/{rank1}'), f"file '{rank1}' is missing")
    damaged('truncated file', lambda d: os.truncate(f'{d}/{rank1}', os.path.getsize(f'{d}/{rank1}') - 100),
            f"file '{rank1}' is")

    def flip(d):
        p = f'{d}/{rank1}'
        data = bytearray(open(p, 'rb').read())
        data[-5] ^= 0x10  # a data byte of the last tensor
        open(p, 'wb').write(bytes(data))
    damaged('flipped byte', flip, 'checksum mismatch in file')

    def break_index(d):
        text = open(f'{d}/index.json').read()
        open(f'{d}/index.json', 'w').write(text[: len(text) // 2])
    damaged('broken index', break_index, 'not valid JSON')
    damaged('a tensor the checkpoint lacks (model has 3 layers)', lambda d: None, "has no tensor 'block2.w1'",
            ['--layers', '3'])
    damaged('a tensor the model lacks (model has 1 layer)', lambda d: None, "which the model lacks", ['--layers', '1'])
    damaged('a shape that differs (--d 32)', lambda d: None, "has shape", ['--d', '32'])
    # Index edits and a FIFO: rejected by load and by tessera-consolidate alike (one validation path).
    def consolidate_rejects(name, mutate, expect):
        d = f'{work}/damaged'
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(newest, d)
        mutate(d)
        try:
            out = subprocess.run([consolidate, d, f'{work}/rejected.safetensors'], capture_output=True, text=True,
                                 timeout=60)
            lines = [l for l in out.stderr.splitlines() if l.startswith('tessera:')]
            check(f'consolidate rejects: {name}', out.returncode != 0 and any(expect in l for l in lines),
                  (lines[0] if lines else out.stderr.strip()[-300:]))
        except subprocess.TimeoutExpired:
            check(f'consolidate rejects: {name}', False, 'blocked for 60 s')

    def edit_index(change):
        def mutate(d):
            j = json.load(open(f'{d}/index.json'))
            change(j)
            json.dump(j, open(f'{d}/index.json', 'w'), indent=1)
        return mutate

    def swap_keys(j):  # one tensor's bytes filed under another's name
        names = sorted(j['tensors'])
        a, b = j['tensors'][names[0]], j['tensors'][names[1]]
        a['pieces'], b['pieces'] = b['pieces'], a['pieces']

    def transpose(j):
        t = next(t for t in j['tensors'].values() if len(t['shape']) == 2 and t['shape'][0] != t['shape'][1])
        t['shape'].reverse()

    def as_fifo(d):
        os.remove(f'{d}/{rank1}')
        os.mkfifo(f'{d}/{rank1}')

    for name, mutate, expect in [
            ('tensors filed under each other\'s names', edit_index(swap_keys), 'does not match its checksum'),
            ('a transposed shape', edit_index(transpose), 'does not match its checksum'),
            ('next_step -5', edit_index(lambda j: j['extra'].update(next_step=-5)), 'does not match its checksum'),
            ('a dropped tensor', edit_index(lambda j: j['tensors'].pop(sorted(j['tensors'])[0])),
             'does not match its checksum'),
            ('a FIFO in place of a rank file', as_fifo, 'is not a regular file')]:
        damaged(name, mutate, expect)
        consolidate_rejects(name, mutate, expect)

    # Edits with the checksum removed: an index without index_checksum is refused
    # whatever it holds (a transposed shape or a dropped tensor keeps the structure
    # valid, so nothing else could tell them from the saved index).
    def unchecked(change):
        def edit(j):
            change(j)
            j.pop('index_checksum')
        return edit
    def bad_scale(j):  # exact_reduction's per-unit scale out of its range (--deterministic indexes hold them)
        j['exact_scales'] = {'embed': 100000}
    for name, change in [('swapped keys', swap_keys), ('a transposed shape', transpose),
                         ('a dropped tensor', lambda j: j['tensors'].pop(sorted(j['tensors'])[0])),
                         ('an exact scale out of range', bad_scale)]:
        damaged(f'{name}, no index checksum', edit_index(unchecked(change)), 'has no index_checksum')
        consolidate_rejects(f'{name}, no index checksum', edit_index(unchecked(change)), 'has no index_checksum')

    # Damage an attacker re-signs: the index checksum recomputed after the edit,
    # so only the file checksums and the header's metadata can tell.
    def resigned(change):
        def edit(j):
            change(j)
            j.pop('index_checksum')
            j['index_checksum'] = _hex(checksum64(_canonical(j)))
        return edit
    def wrong_file_checksum(j):
        f = j['files'][1]
        f['checksum'] = f'{int(f["checksum"], 16) ^ 1:016x}'
    def wrong_range_checksum(j):  # a range's checksum edited to match bytes changed in the file
        r = next(p for t in j['tensors'].values() for p in t['pieces'] if p['file'] == 1)['ranges'][0]
        r['checksum'] = f'{int(r["checksum"], 16) ^ 1:016x}'
    def header_step(d):  # "step":"4" -> "step":"5" in rank 1's header: same length, same offsets
        p = f'{d}/{rank1}'
        data = open(p, 'rb').read()
        assert b'"step":"4"' in data[:4096]
        open(p, 'wb').write(data.replace(b'"step":"4"', b'"step":"5"', 1))
    for name, mutate, expect in [
            ('a wrong file checksum under a re-signed index', edit_index(resigned(wrong_file_checksum)),
             f"file '{rank1}' does not match its checksum in the index"),
            ('a range checksum edited under a re-signed index', edit_index(resigned(wrong_range_checksum)),
             f"file '{rank1}' does not match its checksum in the index"),
            ("a rank file's header metadata changed (step)", header_step, "__metadata__ 'step' is '5'")]:
        damaged(name, mutate, expect)
        consolidate_rejects(name, mutate, expect)

    _, after = run(2, ['--steps', '6', '--load', good])
    check('the previous checkpoint still loads after every damage', min(after) == 2)

    # ---- crash in the middle of a save ----
    for point in ('before-sync', 'after-files', 'before-index', 'before-rename'):
        root = f'{work}/crash-{point}'
        res, _ = run(2, ['--steps', '4', '--save', root, '--save-every', '2'], expect_ok=False,
                     extra_env={'TESSERA_CHECKPOINT_CRASH': f'{point}:2'})
        steps = sorted(d for d in os.listdir(root) if d.startswith('step-'))
        _, resumed = run(2, ['--steps', '6', '--load', root])
        check(f'killed at {point} of the second save: the first checkpoint loads',
              res.returncode != 0 and steps == ['step-000000002'] and min(resumed) == 2,
              f'exit {res.returncode}, {os.listdir(root)}, resumed at {min(resumed) if resumed else None}')

    # ---- keep ----
    run(2, ['--steps', '5', '--save', f'{work}/k', '--save-every', '1', '--keep', '2'])
    kept = sorted(d for d in os.listdir(f'{work}/k') if d.startswith('step-'))
    check('--keep 2 keeps the newest two', kept == ['step-000000004', 'step-000000005'], f'{kept}')

    # ---- one directory, one job ----
    # A job claims --save's directory for its whole life: a second job saving
    # there fails at its start, even between the first one's saves.
    root = f'{work}/claimed'
    first = subprocess.Popen([mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', '2', trainer] + MODEL +
                             ['--steps', '1000000', '--log-every', '1000000', '--save', root, '--save-every', '1000000'],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        for _ in range(300):  # the claim is taken before the first step
            if os.path.exists(f'{root}/.tessera-save.lock') and os.path.getsize(f'{root}/.tessera-save.lock') > 0:
                break
            time.sleep(0.1)
        t0 = time.time()
        res, _ = run(2, ['--steps', '2', '--save', root], expect_ok=False)
        lines = [l for l in res.stderr.splitlines() if l.startswith('tessera:')]
        check('a second job saving into a claimed directory fails at its start, naming the holder',
              res.returncode != 0 and any('is being saved to by another process (pid' in l for l in lines)
              and time.time() - t0 < 60 and not any(d.startswith('step-') for d in os.listdir(root)),
              lines[0] if lines else res.stderr.strip()[-300:])
    finally:  # SIGTERM: mpirun ends its ranks (SIGKILL would leave them running, holding the claim)
        first.terminate()
        try:
            first.wait(timeout=30)
        except subprocess.TimeoutExpired:
            first.kill()
            first.wait()
    # What killed saves left (a temporary, a retired or a moved-aside step) goes at the next claim.
    for n in ('.tmp-step-000000099', '.retired-step-000000001', '.old-step-000000002'):
        os.makedirs(f'{root}/{n}/x', exist_ok=True)
    run(2, ['--steps', '1', '--save', root])
    left = sorted(d for d in os.listdir(root) if d.startswith('.') and d != '.tessera-save.lock')
    check('leftovers of killed saves are removed', left == [], f'{left}')
finally:
    shutil.rmtree(work, ignore_errors=True)

print(f'{len(failures)} failed' + (': ' + ', '.join(failures) if failures else ''))
sys.exit(1 if failures else 0)
