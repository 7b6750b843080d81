#!/usr/bin/env python3
"""tessera-plan memory --model gpt against tessera-gpt's own estimate: for
configurations over the wrappers, strategies, the three precisions, --recompute,
a mesh and --deterministic, on 1-4 host ranks, the planner's total (no MPI,
nothing allocated) equals the estimate tessera-gpt prints in its JSON
summary for the same flags, byte for byte, and so does the host run's
library-counted peak. On the GPU side, the planner's
CUDA count for GPT-2 124M at batch 32 in bf16 is held to the peak measured on
an H200 (bench/results; the library's device memory at its peak) within 1%.
Flags that are the MLP's only are one tessera: line and exit 2.

usage: check_plan_gpt.py MPIEXEC TESSERA_GPT PLANNER RESULTS_DIR"""
import glob
import json
import os
import re
import subprocess
import sys

from plan_vs_trainer import plan_json, trainer_vs_planner

mpiexec, trainer, planner, results = sys.argv[1:5]
model = ['--layers', '2', '--heads', '4', '--d', '64', '--seq', '32', '--vocab', '300']
cases = [  # ranks, flags both programs take
    (1, ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--precision', 'fp32', '--batch', '3']),
    (2, ['--wrapper', 'ddp', '--strategy', 'no_shard', '--precision', 'bf16', '--batch', '2']),
    (3, ['--wrapper', 'fsdp', '--strategy', 'optim', '--precision', 'fp32', '--batch', '1']),
    (3, ['--wrapper', 'fsdp2', '--strategy', 'optim_grads_params', '--precision', 'bf16', '--batch', '2', '--recompute']),
    (2, ['--wrapper', 'ddp', '--strategy', 'optim_grads', '--precision', 'fp32', '--batch', '2']),
    (4, ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--precision', 'fp32', '--batch', '1',
         '--shard-group', '2', '--outer', 'optim']),
    (2, ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--precision', 'bf16', '--batch', '2',
         '--deterministic', '--accum', '2']),
    (3, ['--wrapper', 'fsdp2', '--strategy', 'optim_grads_params', '--precision', 'fp8', '--batch', '2']),  # + code buffers
]
fail = trainer_vs_planner(mpiexec, trainer, planner, ['--model', 'gpt'] + model, cases)
plan = lambda np_, flags: plan_json(planner, np_, flags)

# The CUDA count against an H200's measured peaks: tessera-gpt's JSON summaries
# of the newest GPT-2 speed run (its date and tag; the net as it is now), batch
# and model from the file name. cuDNN's attention workspace is cuDNN's choice
# at run time: the trainer adds it to its estimate, the planner cannot, so it
# is taken off the measured peak (attention_workspace_bytes).
SET = os.environ.get('TESSERA_PLAN_RESULTS', '2026-12-04-h200-gpt-chunks')
measured = []
for f in sorted(glob.glob(os.path.join(results, SET + '-gpt-*-tessera.json')) +
                glob.glob(os.path.join(results, SET + '-gpt-variant-*.json'))):
    name = os.path.basename(f)
    m = re.search(r'-gpt-(gpt2(?:-medium|-large|-xl)?)-b(\d+)-', name)
    model_name, batch = (m.group(1), int(m.group(2))) if m else ('gpt2', 32)  # the variants: 124M at batch 32
    for line in open(f):
        if '"summary"' in line:
            measured.append((name, model_name, batch, json.loads(line)))
if len(measured) < 3:
    fail += 1
    print(f'FAIL {len(measured)} measured tessera-gpt summaries under {results}')
for name, model_name, batch, s in measured:
    flags = ['--model', model_name, '--batch', str(batch), '--precision', s['precision'], '--backend', 'cuda',
             '--wrapper', s['wrapper'], '--strategy', s['strategy']] + (['--recompute'] if 'recompute' in name else [])
    p = plan(1, flags)
    peak = s['peak_bytes'] - s.get('attention_workspace_bytes', 0)
    rel = abs(p['total_bytes'] - peak) / peak
    ok = rel <= 0.01 and p['params'] == s['params']
    fail += not ok
    print(f'{"ok  " if ok else "FAIL"} {name}: planner {p["total_bytes"]} B against the measured peak '
          f'{peak} B ({rel:.3%})')

# A step graph (--cuda-graphs auto or on; tessera-gpt's default is off) holds
# every micro-batch's tokens and targets at once: --accum 3 at batch 4 adds two
# slots of 2 x 4 x 1024 uint16 on one GPU, and nothing where graphs cannot run
# (two ranks).
def cuda_total(gpus, extra):  # plan() drops --accum (tessera-gpt's estimate at one micro-batch does not use it)
    res = subprocess.run([planner, 'memory', '--gpus', str(gpus), '--json', '--model', 'gpt2', '--batch', '4',
                          '--backend', 'cuda', '--accum', '3'] + extra, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f'tessera-plan --cuda-graphs {extra} exited {res.returncode}: {res.stderr}')
    return json.loads(res.stdout)['total_bytes']
for gpus, want in [(1, 2 * 2 * 4 * 1024 * 2), (2, 0)]:
    off, default, on = cuda_total(gpus, ['--cuda-graphs', 'off']), cuda_total(gpus, []), cuda_total(gpus, ['--cuda-graphs', 'on'])
    ok = default == off and on - off == want
    fail += not ok
    print(f'{"ok  " if ok else "FAIL"} --cuda-graphs on at --accum 3, {gpus} GPU(s): +{on - off} B (want +{want}), '
          f'default {"= off" if default == off else "!= off"}')

# --keep-gelu holds every block's GELU output (n x 4 d bf16) where one is shared; --recompute keeps one block anyway.
n, d, layers = 4 * 1024, 768, 12
for extra, want in [([], (layers - 1) * n * 4 * d * 2), (['--recompute'], 0)]:
    base = cuda_total(1, ['--precision', 'bf16'] + extra)
    kept = cuda_total(1, ['--precision', 'bf16', '--keep-gelu'] + extra)
    ok = kept - base == want
    fail += not ok
    print(f'{"ok  " if ok else "FAIL"} --keep-gelu {" ".join(extra)}: +{kept - base} B (want +{want})')

# The MLP's flags are refused under --model, and the GPT's without it.
for flags, want in [(['--model', 'gpt2', '--recompute-gelu'], "tessera-gpt (--model) takes none of them"),
                    (['--keep-gelu'], "--keep-gelu describes tessera-gpt's model; give --model too"),
                    (['--model', 'gpt2', '--backend', 'host', '--keep-gelu'], "--keep-gelu keeps the CUDA net's GELU"),
                    (['--batch', '4'], '--batch describes tessera-gpt\'s model; give --model too'),
                    (['--model', 'gpt2', '--layers', '3'], '--model gpt2 sets --layers; drop one of them'),
                    (['--model', 'gpt', '--heads', '5'], '--heads 5 does not divide --d 64'),
                    (['--model', 'gpt2', '--precision', 'fp8'], '--precision fp8 runs on the host backend so far'),
                    (['--precision', 'fp8'], "--precision fp8 is tessera-gpt's and tessera-llama's")]:
    res = subprocess.run([planner, 'memory', '--gpus', '1'] + flags, capture_output=True, text=True)
    ok = res.returncode == 2 and want in res.stderr and res.stderr.startswith('tessera:')
    fail += not ok
    print(f'{"ok  " if ok else "FAIL"} {" ".join(flags)}: exit {res.returncode}, {res.stderr.strip()}')
sys.exit(1 if fail else 0)
