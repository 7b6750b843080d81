#!/usr/bin/env python3
"""tessera-plan memory --model llama against tessera-llama's own estimate:
over the wrappers, strategies, both precisions, --recompute, tied tables, a
mesh and --deterministic, on 1-4 host ranks, the planner's total equals the
estimate tessera-llama prints and the host run's library-counted peak, byte
for byte. The presets' sizes are the published ones, and the flags of the
wrong model are one tessera: line and exit 2.

usage: check_plan_llama.py MPIEXEC TESSERA_LLAMA PLANNER"""
import json
import subprocess
import sys

from plan_vs_trainer import plan_json, trainer_vs_planner

mpiexec, trainer, planner = sys.argv[1:4]
model = ['--model', 'llama', '--layers', '2', '--heads', '4', '--kv-heads', '2', '--d', '64', '--ffn', '176',
         '--seq', '32', '--vocab', '300']
cases = [
    (1, ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--precision', 'fp32', '--batch', '3']),
    (2, ['--wrapper', 'ddp', '--strategy', 'no_shard', '--precision', 'bf16', '--batch', '2', '--tie-embeddings']),
    (3, ['--wrapper', 'fsdp', '--strategy', 'optim', '--precision', 'fp32', '--batch', '1']),
    (3, ['--wrapper', 'fsdp2', '--strategy', 'optim_grads_params', '--precision', 'bf16', '--batch', '2', '--recompute']),
    (4, ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--precision', 'fp32', '--batch', '1',
         '--shard-group', '2', '--outer', 'optim']),
    (2, ['--wrapper', 'fsdp', '--strategy', 'optim_grads_params', '--precision', 'bf16', '--batch', '2',
         '--deterministic', '--accum', '2', '--head-dim', '8']),
    (2, ['--wrapper', 'fsdp', '--strategy', 'optim_grads', '--precision', 'fp8', '--batch', '2', '--recompute']),
]
fail = trainer_vs_planner(mpiexec, trainer, planner, model, cases)

# The presets: the published parameter counts (HF's num_parameters(), the
# tables padded to a multiple of 128 rows here: 128256 is one already).
for name, params in [('llama3.2-1b', 1235814400), ('llama3.2-3b', 3212749824), ('llama3.1-8b', 8030261248)]:
    p = plan_json(planner, 8, ['--model', name, '--batch', '1', '--backend', 'cuda', '--precision', 'bf16'])
    ok = p['params'] == params and p['tokens_per_rank'] == 2048
    fail += not ok
    print(f'{"ok  " if ok else "FAIL"} {name}: {p["params"]} parameters (want {params}), '
          f'{p["total_bytes"] / 2**30:.2f} GiB per GPU on 8')

for flags, want in [(['--model', 'llama3.2-1b', '--kv-heads', '4'], '--model llama3.2-1b sets --kv-heads; drop one'),
                    (['--model', 'gpt2', '--ffn', '100'], "--ffn describes tessera-llama's model; give --model llama"),
                    (['--model', 'llama', '--keep-gelu'], "--keep-gelu is tessera-gpt's"),
                    (['--model', 'llama', '--kv-heads', '3'], '--kv-heads 3 does not divide --heads 4'),
                    (['--model', 'gpt', '--vocab', '128256'], "over tessera-gpt's 65536")]:
    res = subprocess.run([planner, 'memory', '--gpus', '1'] + flags, capture_output=True, text=True)
    ok = res.returncode == 2 and want in res.stderr and res.stderr.startswith('tessera:')
    fail += not ok
    print(f'{"ok  " if ok else "FAIL"} {" ".join(flags)}: exit {res.returncode}, {res.stderr.strip()}')
sys.exit(1 if fail else 0)
