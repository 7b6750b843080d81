#!/usr/bin/env python3
"""tessera-plan's time commands, no GPU:
- calibrate, from the measurements the committed topology names, gives that
  topology again (the figures in bench/results/*-topology.json are reproducible);
- validate on bench/results passes: every measured 1-, 2- and 4-GPU step (JSON,
  and the benchmark's printed logs) within 10% of its prediction, memory within 2%
  (exit 0), and exits 1 on a bound no row meets;
- predict, sweep, best and collective answer with sane JSON: the step is at least
  compute + optimizer, tokens/s per GPU falls as a flat ring grows to 4096 GPUs,
  best names a configuration that fits and is no slower than its runner-up;
- damaged input (a topology that is not JSON, a negative bandwidth, a units file
  without params, a list with a zero) exits 2 with one tessera: line.

usage: check_plan_time_tool.py PLANNER RESULTS_DIR"""
import glob
import json
import os
import subprocess
import sys
import tempfile

planner, results = sys.argv[1:3]
fail = 0


def run(args, want=0):
    global fail
    p = subprocess.run([planner] + args, capture_output=True, text=True, timeout=300)
    if p.returncode != want:
        print(f'FAIL {" ".join(args)}: exit {p.returncode}, want {want}\n{p.stdout[-3000:]}{p.stderr[-2000:]}')
        fail = 1
    return p


def check(cond, what):
    global fail
    print(('ok: ' if cond else 'FAIL: ') + what)
    fail |= not cond


model = ['--layers', '8', '--d', '4096', '--ctx', '8']
topo = sorted(glob.glob(os.path.join(results, '*-topology.json')))[-1]
committed = json.load(open(topo))
with tempfile.TemporaryDirectory() as tmp:
    # calibrate reproduces the committed topology from the files it names
    colls = [os.path.join(results, f) for f in committed['calibrated_from'] if 'collectives' in f]
    trains = [os.path.join(results, f) for f in committed['calibrated_from'] if 'collectives' not in f]
    out = os.path.join(tmp, 'topo.json')
    run(['calibrate', '--name', committed['name'], '--collectives'] + colls + ['--train'] + trains + ['-o', out])
    again = json.load(open(out))
    same = all(abs(again[k] - committed[k]) <= 1e-9 * max(1, abs(committed[k]))
               for k in ['tflops', 'copy_gbs', 'interference', 'unit_overhead_us', 'nic_gbs'])
    same &= all(abs(again['intra_node'][c][f] - committed['intra_node'][c][f]) <= 1e-9 * max(1, committed['intra_node'][c][f])
                for c in committed['intra_node'] for f in committed['intra_node'][c])
    check(same, f'calibrate from {len(colls)} collective and {len(trains)} step files reproduces {os.path.basename(topo)}')

    v = run(['validate', '--results', results, '--json'])
    j = json.loads(v.stdout)
    rows = [r for r in j['rows'] if not r['superseded']]
    worst_t = max(abs(r['time_off']) for r in rows)
    worst_m = max(abs(r['memory_off']) for r in rows)
    gpus = sorted({r['gpus'] for r in rows})
    from_text = [r for r in rows if r['file'].endswith('.txt')]
    check(j['off'] == 0 and len(rows) >= 50 and gpus == [1, 2, 4] and any(' ce' in r['config'] for r in from_text)
          and any('gb 11' in r['config'] for r in from_text),
          f'validate: {len(rows)} rows on {gpus} GPUs ({len(from_text)} from printed logs: copy engines, 11 gather '
          f'buffers), worst time {100 * worst_t:.1f}%, worst memory {100 * worst_m:.2f}%')
    run(['validate', '--results', results, '--time-bound', '0.0001'], want=1)

    p = json.loads(run(['predict'] + model + ['--tokens', '16384', '--gpus', '2', '--topology', topo, '--json']).stdout)
    check(p['step_ms'] >= p['compute_ms'] + p['optimizer_ms'] - 1e-6 and p['exposed_ms'] >= 0 and p['fits'],
          f"predict 1B on 2 GPUs: {p['step_ms']:.2f} ms, {p['tokens_per_s_per_gpu']:.0f} tokens/s per GPU")
    run(['predict'] + model + ['--tokens', '16384', '--gpus', '2', '--gpu-memory', '4'], want=3)

    sweep = os.path.join(tmp, 'sweep.json')
    run(['sweep'] + model + ['--tokens-per-gpu', '8192', '--topology', topo, '--json-out', sweep])
    s = json.load(open(sweep))
    flat = [r for r in s['rows'] if r['line'] == 'fsdp optim_grads_params (flat)']
    hsdp = [r for r in s['rows'] if r['line'].startswith('fsdp optim_grads_params HSDP')]
    check(len(flat) == 10 and flat[-1]['gpus'] == 4096 and flat[-1]['tokens_per_s_per_gpu'] < flat[0]['tokens_per_s_per_gpu']
          and hsdp[-1]['tokens_per_s_per_gpu'] > flat[-1]['tokens_per_s_per_gpu'],
          f"sweep: flat ring {flat[0]['tokens_per_s_per_gpu']:.0f} -> {flat[-1]['tokens_per_s_per_gpu']:.0f} tokens/s "
          f"per GPU from 8 to 4096 GPUs, HSDP {hsdp[-1]['tokens_per_s_per_gpu']:.0f} at 4096")

    b = json.loads(run(['best'] + model + ['--tokens', '65536', '--gpus', '8', '--gpu-memory', '12', '--topology', topo,
                        '--json']).stdout)
    check(b['best']['memory_bytes'] <= 12 * 2 ** 30 and b['runner_up']['step_ms'] >= b['best']['step_ms'] and b['tried'] > 50,
          f"best of {b['tried']} for 8 GPUs in 12 GiB: {b['best']['config']} ({b['best']['step_ms']:.2f} ms), "
          f"margin {100 * b['margin']:.2f}%")
    run(['best'] + model + ['--tokens', '65536', '--gpus', '8', '--gpu-memory', '0.5'], want=1)

    c = json.loads(run(['collective', '--op', 'reduce_scatter', '--gpus-list', '32,1024', '--json']).stdout)
    check(c['rows'][0]['busbw_gbs'] > c['rows'][1]['busbw_gbs'],
          f"collective: 8 GiB reduce-scatter busbw {c['rows'][0]['busbw_gbs']:.0f} GB/s on 4 nodes, "
          f"{c['rows'][1]['busbw_gbs']:.0f} on 128 (published: 360, 260)")

    units = os.path.join(tmp, 'units.json')
    json.dump([{'name': 'a', 'params': 1000000, 'flops_per_token': 6e6}, {'name': 'b', 'params': 3000}], open(units, 'w'))
    u = json.loads(run(['predict', '--units', units, '--tokens', '4096', '--gpus', '4', '--json']).stdout)
    check(u['params'] == 1003000 and u['step_ms'] > 0, f"predict --units: {u['params']} parameters, {u['step_ms']:.3f} ms")

    # Bad input: exit 2, one tessera: line.
    bad_topo = os.path.join(tmp, 'bad.json')
    open(bad_topo, 'w').write('{"gpus_per_node": 8, "intra_node": {"all_gather": {"busbw_gbs": -3}}}')
    not_json = os.path.join(tmp, 'not.json')
    open(not_json, 'w').write('{"gpus_per')
    no_params = os.path.join(tmp, 'np.json')
    open(no_params, 'w').write('[{"name": "x"}]')
    for args in [['predict'] + model + ['--topology', bad_topo], ['predict'] + model + ['--topology', not_json],
                 ['predict', '--units', no_params], ['sweep'] + model + ['--gpus-list', '8,0'],
                 ['predict'] + model + ['--gpus', '3', '--shard-group', '2']]:
        p = run(args, want=2)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        check(len(lines) == 1 and lines[0].startswith('tessera:'), f'{" ".join(args[:1] + args[-2:])}: {lines}')
sys.exit(fail)
