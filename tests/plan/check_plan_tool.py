#!/usr/bin/env python3
"""tessera-plan memory against the trainer's own estimate: for configurations
over every wrapper, strategy, precision and a mesh, on 1-4 host ranks, the
planner's total (computed without MPI, without allocating) equals the
busiest rank's estimate that tessera-mlp-lm prints for the same flags after
it has built the wrapper and optimizer, byte for byte, part by part where the
trainer reports parts, and so does the host run's library-counted peak. Bad
flags exit 2 with one tessera: line; a model that does not fit --gpu-memory
exits 3. tessera-mlp-lm --plan auto chooses what
tessera-plan best --search trainer names, and trains with it.

usage: check_plan_tool.py MPIEXEC TRAINER PLANNER"""
import json
import subprocess
import sys

mpiexec, trainer, planner = sys.argv[1:4]
model = ['--layers', '2', '--d', '64', '--ctx', '8', '--tokens', '962']
cases = [  # ranks, flags (shared by both programs)
    (1, ['--wrapper', 'fsdp', '--strategy', 'no_shard', '--precision', 'fp32']),
    (2, ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--precision', 'fp32']),
    (3, ['--wrapper', 'ddp', '--strategy', 'optim', '--precision', 'bf16']),
    (3, ['--wrapper', 'ddp', '--strategy', 'optim_grads', '--precision', 'fp32', '--accum', '2']),
    (2, ['--wrapper', 'fsdp2', '--strategy', 'optim_grads_params', '--precision', 'bf16']),
    (4, ['--wrapper', 'fsdp', '--strategy', 'optim', '--precision', 'bf16']),
    (4, ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--precision', 'fp32', '--shard-group', '2',
         '--outer', 'optim']),
    (4, ['--wrapper', 'fsdp2', '--strategy', 'optim_grads_params', '--precision', 'fp32', '--shard-group', '2']),
    (2, ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--precision', 'bf16', '--offload-optimizer', '0.5']),
    (3, ['--wrapper', 'ddp', '--strategy', 'optim', '--precision', 'bf16', '--offload-optimizer', '--offload-update', 'device']),
    (1, ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--precision', 'fp32', '--offload-optimizer']),
    # --deterministic: exact_reduction's accumulators and limb buffers, whole micro-batches per rank
    (2, ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--precision', 'bf16', '--deterministic', '--micro-tokens', '37']),
    (1, ['--wrapper', 'ddp', '--strategy', 'no_shard', '--precision', 'fp32', '--deterministic', '--micro-tokens', '74']),
    (2, ['--wrapper', 'fsdp2', '--strategy', 'optim_grads_params', '--precision', 'fp32', '--deterministic', '--micro-tokens', '481']),
    (2, ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--precision', 'bf16', '--shard-group', '1',
         '--outer', 'optim', '--deterministic', '--micro-tokens', '481']),
]
fail = 0
for np_, flags in cases:
    run = subprocess.run([mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', str(np_), trainer, '--backend', 'host',
                          '--steps', '1', '--json'] + model + flags, capture_output=True, text=True, timeout=120)
    summary = [json.loads(l) for l in run.stdout.splitlines() if l.startswith('{') and '"summary"' in l]
    if run.returncode != 0 or not summary:
        print(f'FAIL trainer {np_} {flags}: exit {run.returncode}\n{run.stderr[-2000:]}')
        fail = 1
        continue
    s = summary[0]
    pl = subprocess.run([planner, 'memory', '--backend', 'host', '--gpus', str(np_), '--json'] + model + flags,
                        capture_output=True, text=True, timeout=60)
    if pl.returncode != 0:
        print(f'FAIL planner {np_} {flags}: exit {pl.returncode}: {pl.stderr}')
        fail = 1
        continue
    p = json.loads(pl.stdout)
    got = {'total': p['total_bytes'], 'state': p['model_state_bytes'] + p['optimizer_state_bytes'],
           'offloaded': p['offloaded_bytes']}
    want = {'total': s['estimated_bytes'], 'state': s['planned_model_state_bytes'],
            'offloaded': s['estimated_offloaded_bytes']}
    # ... and the host's library-counted peak is that estimate, byte for byte (bf16's widened unit included).
    ok = got == want and s['peak_bytes'] == s['estimated_bytes']
    fail |= not ok
    print(f"{'ok' if ok else 'FAIL'}: {np_} ranks {' '.join(flags)}: planner {got}, trainer {want}, peak {s['peak_bytes']}")

def expect(args, code, text):
    global fail
    r = subprocess.run([planner] + args, capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    good = r.returncode == code and (code == 3 or (len(lines) == 1 and lines[0].startswith('tessera:') and text in lines[0]))
    fail |= not good
    print(f"{'ok' if good else 'FAIL'}: {' '.join(args)} -> exit {r.returncode} {r.stderr.strip()}")

expect(['memory', '--gpus', '6', '--shard-group', '4'], 2, 'does not divide')
expect(['memory', '--outer', 'optim', '--gpus', '2'], 2, '--outer optim needs --shard-group')
expect(['memory', '--wrapper', 'ddp', '--strategy', 'optim_grads_params'], 2, 'not a valid combination')
expect(['memory', '--d', '30', '--ctx', '8'], 2, 'multiple of --ctx')
expect(['memory', '--layers', '8', '--d', '4096', '--tokens', '8192', '--gpu-memory', '16'], 3, '')
expect(['memory', '--lend-grad-shards', '--backend', 'host'], 2, "cuda trainer's")
expect(['memory', '--lend-grad-shards', '--accum', '2'], 2, 'use --accum 1')
# tessera-mlp-lm --plan auto takes what tessera-plan best --search trainer names, and trains with it.
for np_, flags in [(2, ['--precision', 'fp32', '--tokens', '962']),
                   (4, ['--precision', 'fp32', '--layers', '4', '--d', '128', '--tokens', '4096', '--gpu-memory', '0.0197']),
                   (3, ['--precision', 'bf16', '--tokens', '960'])]:
    gm = [flags[i + 1] for i in range(len(flags)) if flags[i] == '--gpu-memory']
    model_flags = [f for i, f in enumerate(flags) if f != '--gpu-memory' and (i == 0 or flags[i - 1] != '--gpu-memory')]
    b = subprocess.run([planner, 'best', '--backend', 'host', '--gpus', str(np_), '--search', 'trainer', '--json'] +
                       model_flags + (['--gpu-memory'] + gm if gm else []), capture_output=True, text=True, timeout=120)
    run = subprocess.run([mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', str(np_), trainer, '--backend', 'host',
                          '--steps', '2', '--json', '--plan', 'auto'] + flags, capture_output=True, text=True, timeout=120)
    summary = [json.loads(l) for l in run.stdout.splitlines() if l.startswith('{') and '"summary"' in l]
    chose = [l for l in run.stdout.splitlines() if l.startswith('tessera-mlp-lm --plan auto:')]
    ok = b.returncode == 0 and run.returncode == 0 and summary and len(chose) == 1
    if ok:
        best = json.loads(b.stdout)['best']
        ok = chose[0].split(': ', 1)[1].startswith(best['flags'] + ' (predicted')
        ok &= summary[0].get('final_loss', 1e9) < 6
    fail |= not ok
    print(f"{'ok' if ok else 'FAIL'}: --plan auto at {np_} ranks {' '.join(flags)}: {chose[0] if chose else run.stderr[-800:]}"
          f" (tessera-plan best: {json.loads(b.stdout)['best']['flags'] if b.returncode == 0 else b.stderr})")
print('tessera-plan memory check:', 'FAIL' if fail else 'all passed')
sys.exit(fail)
