#!/usr/bin/env bash
# Builds the checkpoint-parser fuzz target with clang's libFuzzer (plus
# AddressSanitizer and UBSan) and runs it for a bounded time from a seed
# corpus of valid and near-valid inputs. Exit 77 (skipped) without libFuzzer.
# Usage: run_fuzz.sh SOURCE_ROOT SECONDS [WORKDIR]
set -euo pipefail
root=$1 seconds=$2 work=${3:-$(mktemp -d)}
cxx=${CLANGXX:-clang++}
command -v "$cxx" >/dev/null || { echo "no $cxx: skipped"; exit 77; }
mkdir -p "$work/corpus"
json_inc=$(dirname "$(find /usr/include /usr/local/include -name json.hpp -path '*nlohmann*' 2>/dev/null | head -1)")/..
if ! "$cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
     -I "$root/include" -I "$json_inc" "$root/tests/fuzz/fuzz_checkpoint.cpp" -o "$work/fuzz" 2>"$work/build.log"; then
  if grep -q "fuzzer" "$work/build.log"; then echo "libFuzzer not available: skipped"; cat "$work/build.log"; exit 77; fi
  cat "$work/build.log"; exit 1
fi
# Seeds: a valid safetensors header (selector byte 1) and a valid index (selector byte 0).
python3 - "$work/corpus" <<'PY'
import json, struct, sys
d = sys.argv[1]
hdr = json.dumps({"__metadata__": {"format": "tessera"}, "a/main": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                  "b/main": {"dtype": "F32", "shape": [2, 1], "data_offsets": [12, 20]}}).encode()
hdr += b' ' * ((8 - len(hdr) % 8) % 8)
open(f'{d}/safetensors', 'wb').write(b'\x01' + struct.pack('<Q', len(hdr)) + hdr + bytes(20))
idx = {"format": "tessera-checkpoint", "version": 1, "step": 4, "strategy": "optim_grads_params", "wrapper": "fsdp",
       "world": 2, "optimizer": "adamw", "optimizer_steps": 4, "optimizer_skipped": 0,
       "states": ["main", "exp_avg", "exp_avg_sq"],
       "files": [{"name": "rank-00000-of-00002.safetensors", "bytes": 400, "checksum": "0123456789abcdef"},
                 {"name": "rank-00001-of-00002.safetensors", "bytes": 400, "checksum": "fedcba9876543210"}],
       "tensors": {"u.w": {"shape": [2, 3], "dtype": "F32", "pieces": [
           {"file": 0, "begin": 0, "count": 4, "ranges": [{"key": f"u.w/{s}", "offset": 64 + 16 * i, "bytes": 16,
                                                         "checksum": "00000000000000ff"} for i, s in enumerate(["main", "exp_avg", "exp_avg_sq"])]},
           {"file": 1, "begin": 4, "count": 2, "ranges": [{"key": f"u.w/{s}", "offset": 64 + 8 * i, "bytes": 8,
                                                         "checksum": "00000000000000ee"} for i, s in enumerate(["main", "exp_avg", "exp_avg_sq"])]}]}},
       "extra": {"next_step": 4}}
open(f'{d}/index', 'wb').write(b'\x00' + json.dumps(idx).encode())
PY
cd "$work"
./fuzz -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 corpus 2>&1 | tail -15
