#!/usr/bin/env bash
# Packs what bench/gpu_check.sh needs to run on a lent GPU machine whose image lacks this
# project's Debian libraries (Highway, SLEEF, OpenBLAS, oneDNN, ONNX, protobuf, GoogleTest) and
# cannot install them: the built `graphfuse` and `graphfuse_cuda_tests` and every shared library
# they load except glibc's and CUDA's own, as gpu_bundle.tar.xz (git-ignored; name it in the
# device call's `carry`). gpu_check.sh unpacks it when present.
#
#   scripts/test.sh && bench/gpu_bundle.sh      # then: carry gpu_bundle.tar.xz
set -euo pipefail
cd "$(dirname "$0")/.."
for b in build/graphfuse build/tests/graphfuse_cuda_tests; do
  [ -x "$b" ] || { echo "gpu_bundle: $b is missing: build first (scripts/test.sh)" >&2; exit 2; }
done
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/gpu_bundle/bin" "$STAGE/gpu_bundle/lib"
cp build/graphfuse build/tests/graphfuse_cuda_tests "$STAGE/gpu_bundle/bin/"
ldd build/graphfuse build/tests/graphfuse_cuda_tests | awk '/=>/ {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libmvec|libpthread|libdl|librt|ld-linux[^/]*)\.so|cuda|nvrtc|cublas' |
  while read -r lib; do cp -L "$lib" "$STAGE/gpu_bundle/lib/"; done
cat > "$STAGE/gpu_bundle/README" <<EOF
Built on $(date -u +%Y-%m-%dT%H:%MZ) from commit $(git rev-parse --short HEAD) on $(. /etc/os-release && echo "$PRETTY_NAME"),
$(ldd --version | head -1). The binaries' test data paths point at $(pwd): gpu_check.sh links
that path to the checkout on the GPU machine.
EOF
echo "$(pwd)" > "$STAGE/gpu_bundle/source_dir"
tar -C "$STAGE" -cJf gpu_bundle.tar.xz gpu_bundle
ls -la gpu_bundle.tar.xz
