#!/usr/bin/env bash
# A multi-megabyte English text for tessera-gpt's learning run (gpu-check
# stage gpt, part learn), made on a machine with Debian's package registry
# (the GPU machine has none: carry the two files there):
#   - the English prose of Debian's fortunes package (scripts/setup installs it);
#   - the reStructuredText sources of Python's documentation (python3.X-doc's
#     html/_sources/*.rst.txt; the package is downloaded and unpacked, not installed).
# Usage: bench/gpu/make_prose.sh OUTDIR   -> OUTDIR/prose-train.txt, OUTDIR/prose-val.txt
# The validation text is every 20th documentation page (whole pages, held
# out), the training text the rest and the fortunes.
set -euo pipefail
out=${1:?usage: make_prose.sh OUTDIR}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fortunes=/usr/share/games/fortunes
[ -d "$fortunes" ] || { echo "tessera: $fortunes missing (scripts/setup installs Debian's fortunes)" >&2; exit 2; }
pkg=$(apt-cache search --names-only '^python3\.[0-9]+-doc$' | sort -V | tail -1 | cut -d' ' -f1)
[ -n "$pkg" ] || { echo "tessera: no python3.X-doc package in the registry" >&2; exit 2; }
(cd "$work" && apt-get download "$pkg" >/dev/null 2>&1 && dpkg-deb -x ./*.deb x)
: >"$out/prose-train.txt"; : >"$out/prose-val.txt"
for f in "$fortunes"/*; do
  case "$f" in *.dat|*.u8) continue ;; esac
  [ -f "$f" ] && [ ! -L "$f" ] && cat "$f" >>"$out/prose-train.txt"
done
i=0
while IFS= read -r f; do
  if (( i % 20 == 19 )); then cat "$f" >>"$out/prose-val.txt"; else cat "$f" >>"$out/prose-train.txt"; fi
  i=$((i + 1))
done < <(find "$work/x" -name '*.rst.txt' | LC_ALL=C sort)
echo "$pkg: $i pages; train $(stat -c %s "$out/prose-train.txt") bytes, validation $(stat -c %s "$out/prose-val.txt") bytes"
