#!/usr/bin/env bash
# Installs the build into a scratch prefix and consumes it the three ways a
# user would: pkg-config, CMake's find_package(tessera), and a plain -I.
set -euo pipefail
build=$1; src=$2
prefix=$(mktemp -d); trap 'rm -rf "$prefix"' EXIT
meson install -C "$build" --quiet --destdir "$prefix" >/dev/null
root=$(find "$prefix" -path '*/include/tessera/tessera.hpp' | head -1)
[ -n "$root" ] || { echo "FAIL: tessera.hpp not installed"; exit 1; }
inst=${root%/include/tessera/tessera.hpp}
pc=$(find "$inst" -name tessera.pc | head -1)
[ -n "$pc" ] || { echo "FAIL: tessera.pc not installed"; exit 1; }
cat > "$prefix/use.cpp" <<'CPP'
#include <tessera/tessera.hpp>
int main() {
  tessera::comm::mpi_session s(nullptr, nullptr);
  tessera::comm::local<> one;
  tessera::ShardedTensor<float, tessera::backend::host> t(one, {5, 3});
  return t.padded_numel() % 16 == 0 ? 0 : 1;
}
CPP
# pkg-config (its prefix relocated to the scratch install)
cflags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --define-variable=prefix="$inst" --cflags tessera)
mpicxx $cflags "$prefix/use.cpp" -o "$prefix/use-pc"
echo "ok: pkg-config --cflags tessera -> $cflags"
# CMake package
cfg=$(find "$inst" -name tessera-config.cmake | head -1)
[ -n "$cfg" ] || { echo "FAIL: tessera-config.cmake not installed"; exit 1; }
mkdir -p "$prefix/cm"
cat > "$prefix/cm/CMakeLists.txt" <<CMK
cmake_minimum_required(VERSION 3.20)
project(use_tessera CXX)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(tessera 0.1 REQUIRED)
add_executable(use "$prefix/use.cpp")
target_link_libraries(use PRIVATE tessera::tessera MPI::MPI_CXX)
CMK
cmake -S "$prefix/cm" -B "$prefix/cm/b" -DCMAKE_PREFIX_PATH="$inst" >/dev/null
cmake --build "$prefix/cm/b" >/dev/null
echo "ok: find_package(tessera) -> tessera::tessera"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$prefix/cm/b/use"
# A host-only program must not see a CUDA header anywhere.
if mpicxx -std=c++20 -I"$inst/include" -H -fsyntax-only "$prefix/use.cpp" 2>&1 | grep -E 'cuda|nccl' ; then
  echo "FAIL: a host-only build included a CUDA header"; exit 1
fi
echo "ok: no CUDA header in a host-only build"
