#!/usr/bin/env bash
# Packs what bench/gpu_check.sh needs to run on a lent GPU machine whose image lacks this
# project's Debian libraries (Highway, SLEEF, oneDNN, ONNX, protobuf, GoogleTest) and
# cannot install them: the built `graphfuse` and `graphfuse_cuda_tests` and every shared library
# they load except glibc's and CUDA's own, as gpu_bundle.tar.xz (git-ignored; name it in the
# device call's `carry`). gpu_check.sh unpacks it when present.
#
# The GPU machine's CPU is not this one: the two binaries are built apart, in build-gpu-bundle,
# for x86-64-v3 plus AES and CLMUL (AVX2, FMA, F16C: every x86 server CPU since 2015; Highway
# needs the last two for its AVX2 target) rather than -march=native,
# so that a bundle made on an AVX-512 machine does not stop with SIGILL on an AVX2 host.
#
#   scripts/test.sh && bench/gpu_bundle.sh      # then: carry gpu_bundle.tar.xz
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build-gpu-bundle
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DGF_MARCH=-march=x86-64-v3;-maes;-mpclmul" -DGF_BUILD_BENCH=OFF > /dev/null
cmake --build "$BUILD" -j "$(nproc)" --target graphfuse_cli graphfuse_cuda_tests
for b in "$BUILD/graphfuse" "$BUILD/tests/graphfuse_cuda_tests"; do
  [ -x "$b" ] || { echo "gpu_bundle: $b was not built (no CUDA toolkit here?)" >&2; exit 2; }
done
simd=$("$BUILD/graphfuse" demo --preset elementwise --elements 1024 --repeats 1 2>/dev/null)
simd=${simd%%$'\n'*}  # the header line (not `| head -1`: SIGPIPE fails the pipeline under pipefail)
case "$simd" in
  *AVX2) ;;
  *) echo "gpu_bundle: the bundle's SIMD target is not AVX2: $simd" >&2; exit 2 ;;
esac
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/gpu_bundle/bin" "$STAGE/gpu_bundle/lib"
cp "$BUILD/graphfuse" "$BUILD/tests/graphfuse_cuda_tests" "$STAGE/gpu_bundle/bin/"
ldd "$BUILD/graphfuse" "$BUILD/tests/graphfuse_cuda_tests" | awk '/=>/ {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libmvec|libpthread|libdl|librt|ld-linux[^/]*)\.so|cuda|nvrtc|cublas' |
  while read -r lib; do cp -L "$lib" "$STAGE/gpu_bundle/lib/"; done
cat > "$STAGE/gpu_bundle/README" <<EOF
Built on $(date -u +%Y-%m-%dT%H:%MZ) from commit $(git rev-parse --short HEAD) on $(. /etc/os-release && echo "$PRETTY_NAME"),
for -march=x86-64-v3 -maes -mpclmul (AVX2),
$(ldd --version | head -1). The binaries' test data paths point at $(pwd): gpu_check.sh links
that path to the checkout on the GPU machine.
EOF
echo "$(pwd)" > "$STAGE/gpu_bundle/source_dir"
tar -C "$STAGE" -cJf gpu_bundle.tar.xz gpu_bundle
ls -la gpu_bundle.tar.xz
