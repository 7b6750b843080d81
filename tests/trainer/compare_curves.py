#!/usr/bin/env python3
"""Runs tessera-mlp-lm twice, a reference and a candidate, each under mpirun
with --json, and checks that the candidate's loss curve equals the reference's
within a relative tolerance at every logged step.

Usage: compare_curves.py MPIEXEC TRAINER TOL REF_NP "REF FLAGS" CAND_NP "CAND FLAGS" [COMMON FLAGS...]"""
import json
import os
import shlex
import subprocess
import sys

mpiexec, trainer, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
ref_np, ref_flags, cand_np, cand_flags = sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7]
common = sys.argv[8:]
env = dict(os.environ, OPENBLAS_NUM_THREADS='1')


def run(np, flags):
    cmd = [mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', np, trainer, '--json'] + shlex.split(flags) + common
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if res.returncode != 0:
        sys.exit(f'{" ".join(cmd)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}')
    lines = [json.loads(l) for l in res.stdout.splitlines() if l.startswith('{')]
    steps = {l['step']: l['loss'] for l in lines if 'step' in l and not l.get('summary')}
    summary = [l for l in lines if l.get('summary')]
    if not steps or len(summary) != 1:
        sys.exit(f'{" ".join(cmd)}: no JSON steps or summary in:\n{res.stdout}')
    return steps, summary[0], ' '.join(cmd)


ref, ref_sum, ref_cmd = run(ref_np, ref_flags)
cand, cand_sum, cand_cmd = run(cand_np, cand_flags)
assert cand_sum['world'] == int(cand_np) and ref_sum['world'] == int(ref_np)
worst = 0.0
for step, loss in sorted(ref.items()):
    if step not in cand:
        sys.exit(f'step {step} missing from {cand_cmd}')
    rel = abs(cand[step] - loss) / abs(loss)
    worst = max(worst, rel)
    print(f'step {step:4d}  reference {loss:.6f}  candidate {cand[step]:.6f}  rel {rel:.2e}')
first, last = ref[min(ref)], ref[max(ref)]
print(f'worst relative difference {worst:.2e} (tolerance {tol:.0e}); loss {first:.4f} -> {last:.4f}')
if worst > tol:
    sys.exit(f'FAIL: {cand_cmd}\n  differs from {ref_cmd}')
if not last < first - 0.5:
    sys.exit(f'FAIL: the loss did not fall: {first:.4f} -> {last:.4f}')
