#!/usr/bin/env python3
"""tessera-hf-import: a Hugging Face LlamaForCausalLM or GPT2LMHeadModel directory
as a Tessera checkpoint (step 0, fresh optimizer state) that any strategy,
wrapper and world size resumes with --load.

  hf_import.py HF_DIR CKPT_DIR [--trainer PATH] [--seq N] [-- TRAINER FLAGS...]

It runs the model's trainer (tessera-llama or tessera-gpt, by config.json's
model_type; found beside this script, in build/examples, or on PATH) as
`TRAINER --init-from HF_DIR --steps 0 --save CKPT_DIR` on one rank: the very
bridge --init-from runs (the model's conversion table, its refusals of
configurations Tessera does not compute, each tensor read straight from its
bytes), so a directory imported here and one passed to --init-from give the
same weights bit for bit. The checkpoint holds fp32 main weights and the
optimizer's state (zeros): about 12 bytes a parameter of host memory while it
is written. Any failure is one 'tessera:' line and exit code 2."""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINERS = {'llama': 'tessera-llama', 'gpt2': 'tessera-gpt'}


def find_trainer(name):
    for d in (HERE, os.path.join(HERE, '..', 'build', 'examples'), os.path.join(HERE, '..', 'build-demo', 'examples')):
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return shutil.which(name)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('hf_dir')
    ap.add_argument('ckpt_dir')
    ap.add_argument('--trainer', help='the trainer to run (default: by model_type)')
    ap.add_argument('--seq', type=int, default=16, help='--seq of the import run (its activations are allocated)')
    ap.add_argument('flags', nargs='*', help='more trainer flags (after --)')
    a = ap.parse_args(argv[1:])
    try:
        config_path = os.path.join(a.hf_dir, 'config.json')
        try:
            config = json.load(open(config_path))
        except (OSError, ValueError) as e:
            raise ValueError(f'{config_path}: {e}')
        kind = config.get('model_type') if isinstance(config, dict) else None
        if kind not in TRAINERS:
            raise ValueError(f"{config_path}: model_type {kind!r} is not one Tessera trains ({', '.join(TRAINERS)})")
        trainer = a.trainer or find_trainer(TRAINERS[kind])
        if not trainer:
            raise ValueError(f'no {TRAINERS[kind]} beside this script, in build/examples or on PATH (give --trainer)')
    except ValueError as e:
        print(f'tessera: {e}', file=sys.stderr)
        return 2
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT='1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1')
    # The run trains nothing; its data are config.json's bytes (a trainer needs some, and they are always there).
    cmd = [trainer, '--init-from', a.hf_dir, '--steps', '0', '--save', a.ckpt_dir, '--seq', str(a.seq), '--batch', '1',
           '--text', '--data', config_path] + a.flags
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        lines = [l for l in res.stderr.splitlines() if l.startswith('tessera:')]
        print(lines[0] if lines else f'tessera: {" ".join(cmd)} exited {res.returncode}: {res.stderr.strip()[-300:]}',
              file=sys.stderr)
        return 2
    print(f'{a.ckpt_dir}: {TRAINERS[kind]} checkpoint of {a.hf_dir} (step 0)')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
