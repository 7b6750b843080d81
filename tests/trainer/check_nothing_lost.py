#!/usr/bin/env python3
"""Issue 66's hostile cases against the reference trainers' shared loop
(trainer_kit), as a suite that stays: each must end in a tessera: line and a
non-zero exit within seconds on every rank, having written, overwritten and
deleted nothing; or (resuming, validating) give the right result.

 - flags that mean nothing: --seed -1 or 2^64, an empty --data, --val-data or
   --dump-weights, --keep without --save;
 - outputs over inputs: --dump-weights naming the --data file, the --val-data
   file (by another spelling), or a file inside the checkpoint --load reads;
 - a --val-batches the validation file cannot hold without repeating itself;
 - files that are not files: a FIFO (--data --text, --val-data), a directory,
   a path component over 255 characters;
 - ranks that read other files under the same --data (two working
   directories): one error on every rank;
 - --help on one rank of several: the job ends at once (exit 3), not at the
   start-up deadline; --order-check on for one rank and off for another: a
   line naming the option on every rank, not MPI_ERR_TRUNCATE;
 - another run's checkpoints: a fresh run saving into a root that holds them
   (with --keep 1, with --steps 0) is refused and deletes none of them; the
   same root resumed with --load continues its lineage, and --keep retires
   that lineage's older steps only;
 - tools/hf_export.py on damaged checkpoints (files cut short, bytes flipped,
   a file missing or empty): one tessera: line, no traceback, no model file.

usage: check_nothing_lost.py MPIEXEC TESSERA_GPT TESSERA_MLP_LM"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

mpiexec, gpt, mlp = sys.argv[1], os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
env = dict(os.environ, OPENBLAS_NUM_THREADS='1')
fail = 0
tmp = tempfile.mkdtemp(prefix='tessera-lost-')
text = os.path.join(tmp, 'train.txt')
val = os.path.join(tmp, 'val.txt')
with open(text, 'w') as f:
    f.write(''.join(f'line {i}: the quick brown fox jumps over the lazy dog\n' for i in range(200)))
with open(val, 'w') as f:
    f.write(''.join(f'held out {i}: pack my box with five dozen liquor jugs\n' for i in range(20)))
small = ['--layers', '1', '--heads', '2', '--d', '32', '--seq', '16', '--batch', '2', '--text', '--data', text]


def digest(root):
    """Every file under root (or root itself) with its content hash."""
    out = {}
    # (the claim's lock file is the claim's, not the run's data)
    paths = [root] if os.path.isfile(root) else [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                                                 if f != '.tessera-save.lock']
    for p in sorted(paths):
        with open(p, 'rb') as f:
            out[os.path.relpath(p, tmp)] = hashlib.sha256(f.read()).hexdigest()
    return out


def run(np_, trainer, args, timeout=60):
    t0 = time.time()
    cmd = [trainer] + args if np_ == 0 else [mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', str(np_), trainer] + args
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return r, time.time() - t0


def refused(name, np_, trainer, args, want, keep=()):
    """The run ends non-zero with `want` in a tessera: line, quickly, and every path in keep is unchanged."""
    global fail
    before = {k: digest(k) for k in keep}
    try:
        r, s = run(np_, trainer, args)
    except subprocess.TimeoutExpired:
        fail += 1
        print(f'FAIL {name}: still running after 60 s')
        return
    lines = [l for l in r.stderr.splitlines() if l.startswith('tessera:')]
    same = all(digest(k) == before[k] for k in keep)
    ok = r.returncode != 0 and any(want in l for l in lines) and same and s < 30
    fail += not ok
    print(f'{"ok  " if ok else "FAIL"} {name}: exit {r.returncode} in {s:.1f} s, '
          f'{"nothing changed" if same else "FILES CHANGED"}: {lines[0] if lines else r.stderr[-400:]}')


def steps(root):
    return sorted(d for d in os.listdir(root) if d.startswith('step-'))


# ---- flags that mean nothing ----
for t, flags in [(gpt, small), (mlp, ['--layers', '1', '--d', '32', '--ctx', '4', '--tokens', '64'])]:
    name = os.path.basename(t)
    refused(f'{name} --seed -1', 0, t, flags + ['--seed', '-1'], 'is not a whole number from 0 to 18446744073709551615')
    refused(f'{name} --seed 2^64', 0, t, flags + ['--seed', '18446744073709551616'], 'is not a whole number')
    refused(f"{name} --dump-weights ''", 0, t, flags + ['--dump-weights', ''], '--dump-weights needs a path')
    refused(f'{name} --keep without --save', 0, t, flags + ['--keep', '2'], '--keep needs --save DIR')
refused("tessera-gpt --data ''", 0, gpt, small[:-2] + ['--data', ''], '--data needs a path')
refused("tessera-gpt --val-data ''", 0, gpt, small + ['--val-data', ''], '--val-data needs a path')

# ---- outputs over inputs ----
refused('--dump-weights over --data', 2, gpt, small + ['--steps', '1', '--dump-weights', text],
        f"would overwrite --data '{text}'", keep=[text])
other_spelling = os.path.join(tmp, '..', os.path.basename(tmp), '.', 'val.txt')
refused('--dump-weights over --val-data (another spelling)', 2, gpt,
        small + ['--steps', '1', '--val-data', val, '--dump-weights', other_spelling], "would overwrite --val-data", keep=[val])
link = os.path.join(tmp, 'link.txt')
os.symlink(text, link)
refused('--dump-weights over --data through a link', 1, gpt, small + ['--steps', '1', '--dump-weights', link],
        'would overwrite --data', keep=[text])
ck = os.path.join(tmp, 'ck')
r, _ = run(2, gpt, small + ['--steps', '4', '--save', ck, '--save-every', '1', '--keep', '2'])
if r.returncode != 0 or steps(ck) != ['step-000000003', 'step-000000004']:
    sys.exit(f'the first run failed or kept {steps(ck) if os.path.isdir(ck) else None}: {r.stderr[-2000:]}')
refused('--dump-weights inside --load', 2, gpt,
        small + ['--steps', '5', '--load', ck, '--dump-weights', os.path.join(ck, 'step-000000004', 'rank-00000-of-00002.safetensors')],
        f"would overwrite --load '{ck}' (a file inside it)", keep=[ck])

# ---- validation bounded by its file ----
refused('--val-batches past the file', 2, gpt, small + ['--steps', '1', '--val-data', val, '--val-batches', '1048576'],
        'validation sequences of 16 tokens')

# ---- files that are not files ----
fifo = os.path.join(tmp, 'fifo')
os.mkfifo(fifo)
refused('--text --data FIFO', 2, gpt, small[:-1] + [fifo], 'is not a regular file')
refused('--val-data FIFO', 2, gpt, small + ['--val-data', fifo], 'is not a regular file')
refused('--text --data DIR', 2, gpt, small[:-1] + [tmp], 'is not a regular file (a directory)')
refused('a path component over 255 characters', 2, gpt, small[:-1] + [os.path.join(tmp, 'x' * 300, 'a.txt')], '--data')

# ---- ranks that read other files under the same name ----
for d, body in [('d1', 'one text\n' * 300), ('d2', 'another text\n' * 300)]:
    os.makedirs(os.path.join(tmp, d))
    with open(os.path.join(tmp, d, 'same.txt'), 'w') as f:
        f.write(body)
app = os.path.join(tmp, 'app')
with open(app, 'w') as f:
    for d in ('d1', 'd2'):
        f.write(' '.join(['-np', '1', '-wdir', os.path.join(tmp, d), gpt] + small[:-1] + ['same.txt', '--steps', '1']) + '\n')
t0 = time.time()
r = subprocess.run([mpiexec, '--oversubscribe', '--bind-to', 'none', '--app', app], capture_output=True, text=True,
                   env=env, timeout=60)
lines = [l for l in r.stderr.splitlines() if l.startswith('tessera:') and 'the ranks read different --data' in l]
ok = r.returncode != 0 and len(lines) >= 2
fail += not ok
print(f'{"ok  " if ok else "FAIL"} the same relative --data from two working directories: exit {r.returncode} in '
      f'{time.time() - t0:.1f} s, {len(lines)} ranks said so: {lines[0] if lines else r.stderr[-400:]}')

# ---- ranks that disagree on --help: the launcher ends the job at once, not after the start-up deadline ----
with open(app, 'w') as f:
    f.write(' '.join(['-np', '1', gpt, '--help']) + '\n')
    f.write(' '.join(['-np', '1', gpt] + small + ['--steps', '1', '--timeout', '600']) + '\n')
t0 = time.time()
try:
    r = subprocess.run([mpiexec, '--oversubscribe', '--bind-to', 'none', '--app', app], capture_output=True, text=True,
                       env=env, timeout=60)
    s = time.time() - t0
    ok = r.returncode != 0 and s < 30 and '--help under a launcher of 2 ranks' in r.stderr
    fail += not ok
    print(f'{"ok  " if ok else "FAIL"} --help on one rank of two: exit {r.returncode} in {s:.1f} s')
except subprocess.TimeoutExpired:
    fail += 1
    print('FAIL --help on one rank of two: still running after 60 s')

with open(app, 'w') as f:
    for oc in ('on', 'off'):
        f.write(' '.join(['-np', '1', gpt] + small + ['--steps', '1', '--order-check', oc]) + '\n')
t0 = time.time()
try:
    r = subprocess.run([mpiexec, '--oversubscribe', '--bind-to', 'none', '--app', app], capture_output=True, text=True,
                       env=env, timeout=60)
    s = time.time() - t0
    lines = [l for l in r.stderr.splitlines() if l.startswith('tessera:') and '--order-check' in l]
    ok = r.returncode != 0 and s < 30 and len(lines) == 2 and 'TRUNCATE' not in r.stderr
    fail += not ok
    print(f'{"ok  " if ok else "FAIL"} --order-check on one rank, off on another: exit {r.returncode} in {s:.1f} s, '
          f'{len(lines)} ranks said so: {lines[0] if lines else r.stderr[-400:]}')
except subprocess.TimeoutExpired:
    fail += 1
    print('FAIL --order-check on one rank, off on another: still running after 60 s')

# ---- another run's checkpoints ----
refused('a fresh run into another run\'s root, --keep 1', 2, gpt, small + ['--steps', '2', '--save', ck, '--keep', '1'],
        'of another run', keep=[ck])
refused('--steps 0 --save into another run\'s root, --keep 1', 1, gpt, small + ['--steps', '0', '--save', ck, '--keep', '1'],
        'of another run', keep=[ck])
# (at 1 rank of 4 sequences: the global batch the data stream continues at)
r, _ = run(1, gpt, small + ['--batch', '4', '--steps', '7', '--load', ck, '--save', ck, '--save-every', '1', '--keep', '2'])
ok = r.returncode == 0 and steps(ck) == ['step-000000006', 'step-000000007']
fail += not ok
print(f'{"ok  " if ok else "FAIL"} resuming the root continues its lineage and --keep retires its own: {steps(ck)}')
# A root holding another run's steps: a run with --keep there (resumed from
# elsewhere) is refused before it deletes any of them.
mine = os.path.join(tmp, 'mine')
r, _ = run(1, gpt, small + ['--steps', '2', '--save', mine])
refused('a resumed run saving into a third run\'s root', 1, gpt,
        small + ['--steps', '3', '--load', mine, '--save', ck, '--keep', '1'], 'of another run', keep=[ck, mine])

# ---- the Hugging Face export of damaged checkpoints ----
export = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'tools', 'hf_export.py')
good = os.path.join(mine, steps(mine)[-1])
files = sorted(os.path.relpath(os.path.join(d, f), good) for d, _, fs in os.walk(good) for f in fs)
damages = []
for rel in files:
    size = os.path.getsize(os.path.join(good, rel))
    damages += [(rel, 'cut in half', lambda b: b[:len(b) // 2]), (rel, 'empty', lambda b: b''),
                (rel, 'missing', None)]
    for at in sorted({7, 100, size // 2, size - 3}):
        if 0 <= at < size:
            damages.append((rel, f'a byte flipped at {at}', lambda b, at=at: b[:at] + bytes([b[at] ^ 0x5a]) + b[at + 1:]))
bad_exports = []
good_out = os.path.join(tmp, 'hf-good')
subprocess.run([sys.executable, export, good, good_out], check=True, capture_output=True, env=env, timeout=120)
with open(os.path.join(good_out, 'model.safetensors'), 'rb') as f:
    good_model = f.read()
for rel, how, change in damages:
    d = os.path.join(tmp, 'damaged')
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(good, d)
    if change is None:
        os.remove(os.path.join(d, rel))
    else:
        with open(os.path.join(d, rel), 'rb') as f:
            b = f.read()
        with open(os.path.join(d, rel), 'wb') as f:
            f.write(change(b))
    out = os.path.join(tmp, 'hf-out')
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run([sys.executable, export, d, out], capture_output=True, text=True, env=env, timeout=120)
    wrote = os.path.exists(os.path.join(out, 'model.safetensors'))
    if r.returncode == 0:
        # Some bytes carry no meaning the reader can check (padding, a digit
        # of the loss): then the export must equal the undamaged one.
        with open(os.path.join(out, 'model.safetensors'), 'rb') as f:
            if f.read() != good_model:
                bad_exports.append(f'{rel} {how}: exit 0 with OTHER WEIGHTS')
        continue
    if 'Traceback' in r.stderr or not r.stderr.startswith('tessera:') or wrote:
        bad_exports.append(f'{rel} {how}: exit {r.returncode}, {"WROTE A MODEL, " if wrote else ""}{r.stderr[-300:]}')
fail += bool(bad_exports)
print(f'{"ok  " if not bad_exports else "FAIL"} hf_export.py on {len(damages)} damaged checkpoints: '
      f'{len(bad_exports)} without one tessera: line' + ''.join('\n     ' + b for b in bad_exports))
shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if fail else 0)
