#!/usr/bin/env bash
# Builds graphfuse (if needed) and runs `graphfuse demo` on its built-in defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
if [ ! -x build/graphfuse ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >&2
fi
cmake --build build -j "$(nproc)" --target graphfuse_cli >&2
exec ./build/graphfuse demo "$@"
