#!/usr/bin/env python3
"""CI smoke test of tessera-collectives on the host backend: a short sweep
under mpirun, every operation and implementation present with no wrong
element, the nccl-tests footer printed, and the PNG charts made from the JSON.
Usage: collectives_smoke.py MPIEXEC BINARY PLOT_SCRIPT NP"""
import json
import os
import subprocess
import sys
import tempfile

mpiexec, binary, plot, np = sys.argv[1:5]
with tempfile.TemporaryDirectory() as d:
    js = os.path.join(d, 'run.json')
    cmd = [mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', np, binary, '-b', '8', '-e', '64K', '-f', '8',
           '-w', '1', '-n', '3', '--json', js]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(res.stdout[-3000:])
    if res.returncode != 0:
        sys.exit(f'{" ".join(cmd)} exited {res.returncode}\n{res.stderr}')
    assert '# Out of bounds values : 0 OK' in res.stdout, 'no correctness footer'
    assert '# Avg bus bandwidth' in res.stdout
    run = json.load(open(js))
    assert run['world'] == int(np)
    seen = {(r['op'], r['impl']) for r in run['rows']}
    want = {('all_gather', i) for i in ('raw', 'sharded', 'unit', 'unit2', 'mixed')} | \
           {('reduce_scatter', i) for i in ('raw', 'sharded', 'unit', 'unit2', 'mixed')} | \
           {('all_reduce', 'raw'), ('all_reduce', 'unit'), ('broadcast', 'raw'), ('all_gather', 'units'),
            ('all_gather', 'fp8')}
    assert want <= seen, f'missing rows: {want - seen}'
    # raw out of place is also timed one run at a time, as the unit rows are
    alone = {(r['op'], r['bytes']) for r in run['rows'] if r['impl'] == 'raw' and r['placement'] == 'alone'}
    outp = {(r['op'], r['bytes']) for r in run['rows'] if r['impl'] == 'raw' and r['placement'] == 'outplace'}
    assert alone == outp and alone, f'raw alone rows {sorted(alone)} against out-of-place {sorted(outp)}'
    assert all(r['wrong'] == 0 for r in run['rows'])
    # fp8 gathers move half the bytes of mixed's bf16 gathers of the same tensor
    mixed = {r['count']: r['bytes'] for r in run['rows'] if r['op'] == 'all_gather' and r['impl'] == 'mixed'}
    fp8 = {r['count']: r['bytes'] for r in run['rows'] if r['op'] == 'all_gather' and r['impl'] == 'fp8'}
    assert fp8 and fp8.keys() == mixed.keys(), (fp8, mixed)
    assert all(2 * fp8[n] == mixed[n] for n in fp8), (fp8, mixed)
    assert all(r['time_us'] > 0 and r['algbw_gbs'] > 0 for r in run['rows'])
    # --min-busbw far above what a host can do must fail with exit 1
    bad = subprocess.run(cmd[:-2] + ['--min-busbw', '1e9'], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1, f'--min-busbw did not fail: {bad.returncode}'
    out = subprocess.run([sys.executable, plot, os.path.join(d, 'chart'), js], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f'plot failed:\n{out.stderr}')
    pngs = [l for l in out.stdout.split() if l.endswith('.png')]
    assert len(pngs) == 4 and all(os.path.getsize(p) > 1000 for p in pngs), pngs
    print('ok:', len(run['rows']), 'rows,', len(pngs), 'charts')
