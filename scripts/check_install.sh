#!/usr/bin/env bash
# Checks graphfuse as an embedding program gets it: installs the build into a fresh prefix,
# builds examples/embed against it with find_package(graphfuse) (the shared library, the
# static one, and once more with pkg-config), and runs them on exported models with the source and build trees out of reach
# (an empty tmpfs mounted over them in a private mount namespace), the native-loop compiler on:
# its loops must compile against the installed headers.
#
#   scripts/check_install.sh [BUILD_DIR]     (default: build)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

fail() { echo "check_install: $*" >&2; exit 1; }

cmake --install "$BUILD" --prefix "$T/prefix" >"$T/install.log" || { cat "$T/install.log"; fail "cmake --install failed"; }
for f in include/graphfuse/graphfuse.h include/graphfuse/model.h lib/libgraphfuse.so lib/libgraphfuse.a \
         lib/cmake/graphfuse/graphfuseConfig.cmake lib/pkgconfig/graphfuse.pc bin/graphfuse \
         share/graphfuse/codegen/src/cpu/native_io.h; do
  [[ -e $T/prefix/$f ]] || fail "the installation lacks $f"
done
if grep -rlq '\.\./\.\./src\|"src/' "$T/prefix/include/graphfuse"; then fail "a public header includes src/"; fi

cp -r "$ROOT/examples/embed" "$T/embed-src"
cmake -S "$T/embed-src" -B "$T/embed-build" -G Ninja -DCMAKE_PREFIX_PATH="$T/prefix" >"$T/embed-cmake.log" ||
  { cat "$T/embed-cmake.log"; fail "configuring examples/embed against the installation failed"; }
cmake --build "$T/embed-build" >"$T/embed-build.log" || { cat "$T/embed-build.log"; fail "building examples/embed failed"; }
cmake -S "$T/embed-src" -B "$T/embed-static" -G Ninja -DCMAKE_PREFIX_PATH="$T/prefix" -DEMBED_STATIC=ON \
  >"$T/embed-static.log" 2>&1 || { cat "$T/embed-static.log"; fail "configuring examples/embed with COMPONENTS static failed"; }
cmake --build "$T/embed-static" >>"$T/embed-static.log" 2>&1 ||
  { cat "$T/embed-static.log"; fail "building examples/embed against the static library failed"; }
PKG_CONFIG_PATH="$T/prefix/lib/pkgconfig" pkg-config --exists graphfuse || fail "pkg-config does not find graphfuse"
# shellcheck disable=SC2046
${CXX:-c++} -O1 -o "$T/embed-pc" "$T/embed-src/main.cc" $(PKG_CONFIG_PATH="$T/prefix/lib/pkgconfig" pkg-config --cflags --libs graphfuse) ||
  fail "building examples/embed with pkg-config's flags failed"

mkdir -p "$T/models"
for m in llama_block_opset17 gpt2_block_opset13 mlp_gelu_opset17; do cp "$ROOT/tests/models/$m/model.onnx" "$T/models/$m.onnx"; done

# Everything below runs with $ROOT (and the build tree inside it) hidden.
cat >"$T/run.sh" <<RUN
set -euo pipefail
mount -t tmpfs none "$ROOT"
[[ -z \$(ls -A "$ROOT") ]]
export GF_KERNEL_CACHE="$T/cache" LD_LIBRARY_PATH="$T/prefix/lib"
for m in "$T"/models/*.onnx; do
  "$T/embed-build/embed" "\$m" --threads 2
  "$T/embed-pc" "\$m" --no-fuse
  "$T/embed-static/embed" "\$m"
done
# Unfused, every elementwise op is a native loop of its own.
"$T/embed-build/embed" "$T/models/mlp_gelu_opset17.onnx" --no-fuse --cpu-codegen
ls "$T/cache/cpu" | grep -c '^gf_cpu_.*\.so\$'
RUN
# A private mount namespace: root may make one; anyone else, with a user namespace.
if [[ $(id -u) -eq 0 ]]; then hide=(unshare --mount); else hide=(unshare --mount --map-root-user); fi
"${hide[@]}" bash "$T/run.sh" >"$T/out.txt" 2>"$T/err.txt" || { cat "$T/out.txt" "$T/err.txt"; fail "running examples/embed from the installation failed"; }
cat "$T/out.txt"
grep -q '^llama_block_opset17 on cpu\|/llama_block_opset17.onnx on cpu' "$T/out.txt" || fail "no line for the LLaMA block"
grep -q '^y f32\[1,16,64\]$' "$T/out.txt" || fail "the LLaMA block's output 'y f32[1,16,64]' is missing"
compiled=$(tail -1 "$T/out.txt")
[[ $compiled -gt 0 ]] || fail "no native loop was compiled against the installed headers"
echo "check_install: ok (examples/embed from $T/prefix, source tree hidden; $compiled native loops compiled)"
