#!/usr/bin/env bash
# Checkpoint save and load throughput of a trainer (tessera-mlp-lm or
# tessera-gpt) beside the disk's plain sequential write and read speed,
# measured in the same run on the same directory, and the ratio of each.
# Bytes = the checkpoint's files (main weights + optimizer state).
# Usage: checkpoint_io.sh TRAINER DIR [NP] [trainer flags...]
#   e.g. checkpoint_io.sh build/examples/tessera-gpt /tmp/ck 1 --backend cuda --model gpt2-xl --batch 1 --seq 64
#        checkpoint_io.sh build/examples/tessera-mlp-lm /tmp/ck 1 --backend cuda --precision bf16 \
#          --layers 8 --d 4096 --ctx 8 --tokens 8192
# JSON=FILE also writes the figures there. DD_GIB (default 8) sets the size of
# the dd baseline; as root the page cache is dropped before each read.
set -euo pipefail
trainer=$1 dir=$2 np=${3:-1}; shift 3 || true
gib=${DD_GIB:-8}
rm -rf "$dir"; mkdir -p "$dir"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(page cache not dropped: not root)" >&2; }
secs() { sed -n 's/.*copied, \([0-9.e+-]*\) s.*/\1/p' | head -1; }
# Plain disk: written with O_DIRECT and synced, then read back without the page cache.
dd_w=$(dd if=/dev/zero of="$dir/dd.bin" bs=64M count=$((gib * 16)) oflag=direct conv=fsync 2>&1 | secs)
drop
dd_r=$(dd if="$dir/dd.bin" of=/dev/null bs=64M iflag=direct 2>&1 | secs)
rm -f "$dir/dd.bin"
run() { mpirun --oversubscribe --bind-to none -np "$np" "$trainer" "$@"; }
save_line=$(run --steps 1 --save "$dir/ck" "$@" | grep ' saved ')
echo "$save_line"
bytes=$(du -sb "$dir/ck" | cut -f1)
drop
load_line=$(run --steps 1 --load "$dir/ck" "$@" | grep 'resumed from')
echo "$load_line"
python3 - "$bytes" "$gib" "$dd_w" "$dd_r" "$save_line" "$load_line" "${JSON:-}" "$trainer $np $*" <<'PY'
import json, re, sys
b, gib, dw, dr, save, load, out, cmd = sys.argv[1:]
b, dd = int(b), int(gib) * 2**30
w, r = dd / float(dw), dd / float(dr)
s = float(re.search(r"in ([0-9.]+) s", save).group(1))
l = float(re.search(r"in ([0-9.]+) s", load).group(1))
m = re.search(r"read and checked ([0-9.]+) GB in ([0-9.]+) s, copied in ([0-9.]+) s", load)
print(f"disk: dd write (O_DIRECT, fsync) {w / 1e9:.2f} GB/s, dd read (O_DIRECT) {r / 1e9:.2f} GB/s ({int(gib)} GiB)")
print(f"checkpoint: {b / 1e9:.2f} GB")
print(f"save {s:.2f} s = {b / s / 1e9:.2f} GB/s = {b / s / w:.2f} of dd write (files written and synced, index, rename)")
print(f"load {l:.2f} s = {b / l / 1e9:.2f} GB/s = {b / l / r:.2f} of dd read (read, checksums, copy to the model)")
if m:
    print(f"  of which reading and checking {m.group(2)} s ({float(m.group(1)) / float(m.group(2)):.2f} GB/s), "
          f"copying into the model {m.group(3)} s")
if out:
    json.dump({"command": cmd, "checkpoint_bytes": b, "dd_write_Bps": w, "dd_read_Bps": r, "save_s": s, "load_s": l,
               "save_of_dd": b / s / w, "load_of_dd": b / l / r,
               "load_read_s": float(m.group(2)) if m else None, "load_copy_s": float(m.group(3)) if m else None},
              open(out, "w"), indent=1)
PY
rm -rf "$dir"
