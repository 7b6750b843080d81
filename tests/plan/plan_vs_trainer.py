"""What check_plan_gpt.py and check_plan_llama.py share: run a sequence
model's trainer for one step on host ranks and hold tessera-plan memory
--model (no MPI, nothing allocated) to the estimate the trainer prints in
its JSON summary and to the host run's library-counted peak, byte for byte."""
import json
import os
import subprocess
import sys


def plan_json(planner, np_, flags):
    """tessera-plan memory's JSON for the trainer's flags (--accum dropped:
    the estimate at one micro-batch does not use it)."""
    fl, i = [], 0
    while i < len(flags):
        if flags[i] == '--accum':
            i += 2
            continue
        fl.append(flags[i])
        i += 1
    res = subprocess.run([planner, 'memory', '--gpus', str(np_), '--json'] + fl, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f'tessera-plan {fl} exited {res.returncode}: {res.stderr}')
    return json.loads(res.stdout)


def trainer_vs_planner(mpiexec, trainer, planner, model, cases):
    """model: the planner's --model flag and the shape flags both take;
    cases: (ranks, flags both take). Returns the number of failures."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS='1')
    name = os.path.basename(trainer)
    fail = 0
    shape = model[2:]
    for np_, flags in cases:
        run = subprocess.run([mpiexec, '--oversubscribe', '--bind-to', 'none', '-np', str(np_), trainer, '--backend',
                              'host', '--steps', '1', '--json'] + shape + flags,
                             capture_output=True, text=True, env=env, timeout=300)
        if run.returncode != 0:
            sys.exit(f'{name} {flags} at {np_} ranks exited {run.returncode}:\n{run.stdout}\n{run.stderr}')
        summary = [json.loads(l) for l in run.stdout.splitlines() if l.startswith('{') and '"summary"' in l][-1]
        p = plan_json(planner, np_, model[:2] + ['--backend', 'host'] + shape + flags)
        # ... and the host's library-counted peak is that estimate (bf16's widened units included).
        ok = (p['total_bytes'] == summary['estimated_bytes'] == summary['peak_bytes'] and
              p['params'] == summary['params'])
        fail += not ok
        print(f'{"ok  " if ok else "FAIL"} {name} np{np_} {" ".join(flags)}: planner {p["total_bytes"]} B, trainer '
              f'{summary["estimated_bytes"]} B, peak {summary["peak_bytes"]} B (activations {p["activations_bytes"]})')
    return fail
