#!/usr/bin/env python3
"""Compile-fail check: the source must fail to compile, and the compiler's
output must contain the message on the source's first line (`// expect: ...`).
Usage: run.py SOURCE INCLUDE_DIR COMPILER [ARGS...]"""
import subprocess
import sys

src, inc, compiler = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(src) as f:
    first = f.readline()
if not first.startswith('// expect: '):
    sys.exit(f'{src}: first line must be "// expect: <message>"')
expected = first[len('// expect: '):].strip()
cmd = compiler + ['-std=c++20', '-fsyntax-only', '-I', inc, src]
res = subprocess.run(cmd, capture_output=True, text=True)
out = res.stdout + res.stderr
if res.returncode == 0:
    sys.exit(f'{src}: compiled, but must fail with "{expected}"')
if expected not in out:
    sys.exit(f'{src}: failed to compile, but without "{expected}":\n{out[:4000]}')
print(f'{src}: fails with "{expected}"')
