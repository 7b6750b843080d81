#!/usr/bin/env python3
"""Two --dump-weights files of tessera-gpt, tensor by tensor: how many
floats differ and by how many ulps. Exit 1 if any float differs by more than
`max_ulps` or more than `max_differ` floats differ in all (0 0: the same bits).

usage: compare_dumps.py A.safetensors B.safetensors MAX_DIFFER MAX_ULPS"""
import sys

import numpy as np
from safetensors.numpy import load_file

a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
max_differ, max_ulps = int(sys.argv[3]), int(sys.argv[4])
if sorted(a) != sorted(b):
    print(f'FAIL the tensors differ: {sorted(set(a) ^ set(b))}')
    sys.exit(1)
total = differ = worst = 0
for name in sorted(a):
    x, y = a[name], b[name]
    if x.shape != y.shape or x.dtype != y.dtype:
        print(f'FAIL {name}: {x.shape} {x.dtype} against {y.shape} {y.dtype}')
        sys.exit(1)
    xi, yi = x.reshape(-1).view(np.int32).astype(np.int64), y.reshape(-1).view(np.int32).astype(np.int64)
    # ulps apart: the ordered integer images of the floats (sign-magnitude to two's complement)
    xo = np.where(xi < 0, -(xi & 0x7fffffff), xi)
    yo = np.where(yi < 0, -(yi & 0x7fffffff), yi)
    d = np.abs(xo - yo)
    total += d.size
    differ += int(np.count_nonzero(d))
    worst = max(worst, int(d.max()) if d.size else 0)
ok = differ <= max_differ and worst <= max_ulps
print(f'{"ok" if ok else "FAIL"}: {differ} of {total} floats differ, at most {worst} ulp apart '
      f'({len(a)} tensors; allowed {max_differ} floats, {max_ulps} ulp)')
sys.exit(0 if ok else 1)
