#!/usr/bin/env bash
# A one-file consumer built with a plain C++ compiler (no mpicxx) the three
# ways a user would: the installed tessera.pc, the installed CMake package,
# and Tessera as a Meson subproject (which must build nothing of Tessera's own
# unless asked). Each must find MPI and nlohmann_json through Tessera alone.
set -euo pipefail
build=$1; src=$2
prefix=$(mktemp -d); trap 'rm -rf "$prefix"' EXIT
cxx=${CXX:-c++}
meson install -C "$build" --quiet --destdir "$prefix" >/dev/null
root=$(find "$prefix" -path '*/include/tessera/tessera.hpp' | head -1)
[ -n "$root" ] || { echo "FAIL: tessera.hpp not installed"; exit 1; }
inst=${root%/include/tessera/tessera.hpp}
pc=$(find "$inst" -name tessera.pc | head -1)
[ -n "$pc" ] || { echo "FAIL: tessera.pc not installed"; exit 1; }
echo "ok: tessera.pc installed as ${pc#$inst/}"
cat > "$prefix/use.cpp" <<'CPP'
#include <tessera/tessera.hpp>
#include <tessera/checkpoint/checkpoint.hpp>
int main(int argc, char** argv) {
  tessera::comm::mpi_session s(&argc, &argv);
  tessera::comm::mpi world;
  tessera::data_parallel_t<tessera::config<tessera::optim_grads_params, tessera::fsdp>> model(world);
  auto u = model.add_unit("u");
  model.add_param(u, "w", {5, 3});
  model.finalize();
  tessera::ShardedOptimizer opt(model, tessera::adamw{});
  return model.shards().layout(0).padded_numel() % 16 == 0 && opt.steps() == 0 ? 0 : 1;
}
CPP
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# 1. pkg-config (tessera.pc's prefix moved to the scratch install; a
# --define-variable would move MPI's too)
sed -i "s|^prefix=.*|prefix=$inst|" "$pc"
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs tessera)
$cxx "$prefix/use.cpp" $flags -o "$prefix/use-pc"
"$prefix/use-pc"
echo "ok: $cxx use.cpp \$(pkg-config --cflags --libs tessera) -> $flags"
# 2. CMake package: the consumer names tessera::tessera only
cfg=$(find "$inst" -name tessera-config.cmake | head -1)
[ -n "$cfg" ] || { echo "FAIL: tessera-config.cmake not installed"; exit 1; }
mkdir -p "$prefix/cm"
cat > "$prefix/cm/CMakeLists.txt" <<CMK
cmake_minimum_required(VERSION 3.20)
project(use_tessera CXX)
find_package(tessera 0.1 REQUIRED)
add_executable(use "$prefix/use.cpp")
target_link_libraries(use PRIVATE tessera::tessera)
CMK
CXX=$cxx cmake -S "$prefix/cm" -B "$prefix/cm/b" -DCMAKE_PREFIX_PATH="$inst" >/dev/null
cmake --build "$prefix/cm/b" >/dev/null
"$prefix/cm/b/use"
echo "ok: find_package(tessera) -> tessera::tessera"
# 3. Meson subproject: dependency('tessera') from a copy of the source tree
mkdir -p "$prefix/ms/subprojects/tessera"
(cd "$src" && tar --exclude='./build*' --exclude=./.git --exclude='./gpu-bin*' -cf - .) | tar -xf - -C "$prefix/ms/subprojects/tessera"
cat > "$prefix/ms/meson.build" <<'MES'
project('use_tessera', 'cpp', default_options: ['cpp_std=c++20'])
executable('use', 'use.cpp', dependencies: dependency('tessera', fallback: ['tessera', 'tessera_dep']))
MES
cp "$prefix/use.cpp" "$prefix/ms/"
CXX=$cxx meson setup "$prefix/ms/b" "$prefix/ms" >"$prefix/ms/setup.log" 2>&1 || { cat "$prefix/ms/setup.log"; exit 1; }
targets=$(ninja -C "$prefix/ms/b" -t targets all | grep -c -E '^subprojects/tessera/.*(\.o|: cpp_link|: cuda_link)' || true)
[ "$targets" -eq 0 ] || { echo "FAIL: as a subproject Tessera adds $targets build targets of its own"; exit 1; }
ninja -C "$prefix/ms/b" >/dev/null
"$prefix/ms/b/use"
echo "ok: Meson subproject -> dependency('tessera'), no Tessera target built"
# A host-only program must not see a CUDA header anywhere.
if $cxx -std=c++20 -I"$inst/include" $(pkg-config --cflags mpi-c 2>/dev/null || true) -H -fsyntax-only "$prefix/use.cpp" 2>&1 | grep -E 'cuda|nccl' ; then
  echo "FAIL: a host-only build included a CUDA header"; exit 1
fi
echo "ok: no CUDA header in a host-only build"
