#!/usr/bin/env bash
# Checkpoint save and load throughput of the reference trainer beside the
# disk's plain write and read speed, measured in the same run on the same
# directory. Bytes = the checkpoint's files (main weights + optimizer state).
# Usage: checkpoint_io.sh TRAINER DIR [NP] [trainer flags...]
#   e.g. checkpoint_io.sh build/examples/tessera-mlp-lm /tmp/ck 1 --backend cuda --precision bf16 \
#          --layers 8 --d 4096 --ctx 8 --tokens 8192
set -euo pipefail
trainer=$1 dir=$2 np=${3:-1}; shift 3 || true
rm -rf "$dir"; mkdir -p "$dir"
# Plain disk: 4 GiB written with O_DIRECT and synced, then read back without the page cache.
w=$(dd if=/dev/zero of="$dir/dd.bin" bs=64M count=64 oflag=direct conv=fsync 2>&1 | grep -o '[0-9.]* [GM]B/s' | tail -1)
r=$(dd if="$dir/dd.bin" of=/dev/null bs=64M iflag=direct 2>&1 | grep -o '[0-9.]* [GM]B/s' | tail -1)
rm -f "$dir/dd.bin"
echo "disk: dd write (O_DIRECT, fsync) $w, read (O_DIRECT) $r"
run() { mpirun --oversubscribe --bind-to none -np "$np" "$trainer" "$@"; }
save_line=$(run --steps 1 --save "$dir/ck" "$@" | grep 'saved ')
bytes=$(du -sb "$dir/ck" | cut -f1)
save_s=$(echo "$save_line" | grep -o 'in [0-9.]* s' | grep -o '[0-9.]*')
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "(page cache not dropped: not root)"
load_line=$(run --steps 1 --load "$dir/ck" "$@" | grep 'resumed from')
load_s=$(echo "$load_line" | grep -o 'in [0-9.]* s' | grep -o '[0-9.]*')
python3 - "$bytes" "$save_s" "$load_s" <<'PY'
import sys
b, s, l = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
print(f"checkpoint: {b / 1e9:.2f} GB; save {s:.2f} s = {b / s / 1e9:.2f} GB/s (files written and synced, index, rename); "
      f"load {l:.2f} s = {b / l / 1e9:.2f} GB/s (read, checksums, copy to the model)")
PY
rm -rf "$dir"
