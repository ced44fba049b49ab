#!/usr/bin/env bash
# Builds the ONNX-import fuzzers (libFuzzer + ASan + UBSan, clang++ 14) against the project's
# sources and runs each for a bounded time:
#
#   fuzz_onnx_import  raw bytes -> ImportOnnxBytes -> PrintGraph; seeded with the ONNX
#                     node-test models (libonnx-testdata) and tests/models
#   fuzz_onnx_graph   bytes -> a generated, well-formed ONNX graph of random registry ops,
#                     hostile attributes and constants -> ImportOnnxBytes -> Execute
# Both also start from fuzz/regressions/TARGET/: inputs that once failed (kept as seeds, so
# every run replays them first).
#
# Usage:
#   fuzz/run.sh                              build + run both targets, 60 s each
#   GF_FUZZ_SECONDS=600 fuzz/run.sh          longer
#   GF_FUZZ_TARGETS=fuzz_onnx_graph fuzz/run.sh
#   fuzz/run.sh TARGET FILE...               build + replay inputs (regression check)
#   GF_FUZZ_CXXFLAGS=-DGF_FUZZ_NO_PRINT ...  fuzz_onnx_import without the text printer
#
# Exits non-zero when a fuzzer finds a crash, a sanitizer error, a timeout (-timeout=10) or an
# out-of-memory (-rss_limit_mb=2048, any single allocation over 2 GiB); the reproducer is left
# in $GF_FUZZ_OUT/artifacts/ (default build/fuzz/artifacts/).
#
# Debian packages: clang-14, libclang-rt-14-dev (libFuzzer and the sanitizer runtimes),
# libonnx-dev, libprotobuf-dev, libhwy-dev, libsleef-dev, libdnnl-dev, and optionally
# libonnx-testdata (seed corpus).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${GF_FUZZ_OUT:-$ROOT/build/fuzz}
SECONDS_TO_RUN=${GF_FUZZ_SECONDS:-60}
TARGETS=${GF_FUZZ_TARGETS:-fuzz_onnx_import fuzz_onnx_graph}
SEED_DIR=${GF_FUZZ_SEEDS:-/usr/share/libonnx-testdata/data/node}
MAX_SEEDS=${GF_FUZZ_MAX_SEEDS:-400}
CXX=${GF_FUZZ_CXX:-clang++-14}

command -v "$CXX" >/dev/null || { echo "fuzz/run.sh: $CXX not found (apt install clang-14)" >&2; exit 2; }
if ! ls /usr/lib/llvm-14/lib/clang/14*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "fuzz/run.sh: libFuzzer runtime missing (apt install libclang-rt-14-dev)" >&2
  exit 2
fi
mkdir -p "$OUT/obj" "$OUT/artifacts"

# ---- build ----
# The whole library: the importer reaches the IR, every op's schema and kernel (the registry
# links them), the executor, the op table and the CPU code under them.
mapfile -t LIB_SRCS < <(ls "$ROOT"/src/*/*.cc "$ROOT"/src/*/*/*.cc 2>/dev/null | grep -v '/src/cuda/')
CXXFLAGS=(-std=c++20 -O1 -g -fno-omit-frame-pointer -march=native -ffp-contract=off -fwrapv
          -fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined
          -DHWY_COMPILE_ONLY_STATIC=1 -DONNX_NAMESPACE=onnx -DONNX_ML=1
          -I"$ROOT/include" -I"$ROOT/src")
read -r -a EXTRA <<<"${GF_FUZZ_CXXFLAGS:-}"
CXXFLAGS+=("${EXTRA[@]}")
read -r -a PKG_CFLAGS <<<"$(pkg-config --cflags libhwy sleef 2>/dev/null || true)"
read -r -a PKG_LIBS <<<"$(pkg-config --libs libhwy sleef)"
# An object is rebuilt when its source, any header, or this script is newer than it (coarse,
# but a full build takes about a minute).
STAMP=$(find "$ROOT/include" "$ROOT/src" "$ROOT/fuzz" \( -name '*.h' -o -name '*.def' -o -name run.sh \) \
          -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)

compile() {  # compile SRC OBJ
  local src=$1 obj=$2
  if [[ ! -f $obj || $src -nt $obj || $STAMP -nt $obj ]]; then
    # The object is dated when its inputs were read, not when it was written: a source or
    # header edited while it compiled is then newer, and the next run compiles it again.
    local read_at
    read_at=$(stat -c %.9Y "$src" "$STAMP" | sort -n | tail -1)
    "$CXX" "${CXXFLAGS[@]}" "${PKG_CFLAGS[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$obj.tmp"
    touch -d "@$read_at" "$obj.tmp"
    mv "$obj.tmp" "$obj"
  fi
}
object_of() { printf '%s/obj/%s.o' "$OUT" "$(printf '%s' "${1#"$ROOT"/}" | tr '/' '_')"; }

ALL_SRCS=("${LIB_SRCS[@]}")
for t in $TARGETS; do ALL_SRCS+=("$ROOT/fuzz/$t.cc"); done
PIDS=()
for src in "${ALL_SRCS[@]}"; do
  compile "$src" "$(object_of "$src")" &
  PIDS+=($!)
  if (( ${#PIDS[@]} >= $(nproc) )); then
    wait "${PIDS[0]}" || { echo "fuzz/run.sh: compile failed" >&2; exit 2; }
    PIDS=("${PIDS[@]:1}")
  fi
done
for p in "${PIDS[@]}"; do wait "$p" || { echo "fuzz/run.sh: compile failed" >&2; exit 2; }; done

LIB_OBJS=()
for src in "${LIB_SRCS[@]}"; do LIB_OBJS+=("$(object_of "$src")"); done
for t in $TARGETS; do
  "$CXX" -fsanitize=fuzzer,address,undefined -fno-sanitize=vptr "$(object_of "$ROOT/fuzz/$t.cc")" "${LIB_OBJS[@]}" \
    -o "$OUT/$t" -lonnx_proto -lprotobuf "${PKG_LIBS[@]}" -ldnnl -lgomp -lmvec -lm -lpthread
done

export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
LIMITS=(-rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10)

if (( $# > 0 )); then  # replay: fuzz/run.sh TARGET FILE...
  target=$1
  shift
  exec "$OUT/$target" "${LIMITS[@]}" "$@"
fi

# ---- run ----
CORPUS=$(mktemp -d /tmp/gf_fuzz_corpus.XXXXXX)
trap 'rm -rf "$CORPUS"' EXIT
failed=0
for t in $TARGETS; do
  mkdir -p "$CORPUS/$t"
  if [[ $t == fuzz_onnx_import ]]; then
    # Seeds: the node-test models (the smallest MAX_SEEDS) and the exported models.
    if [[ -d $SEED_DIR ]]; then
      find "$SEED_DIR" -name model.onnx -size -64k -printf '%s %p\n' | sort -n | awk -v n="$MAX_SEEDS" 'NR <= n' |
        while read -r _ f; do cp "$f" "$CORPUS/$t/$(basename "$(dirname "$f")").onnx"; done
    fi
    for f in "$ROOT"/tests/models/*/model.onnx; do
      [[ -f $f ]] && cp "$f" "$CORPUS/$t/$(basename "$(dirname "$f")").onnx"
    done
  fi
  # Inputs that once failed (fuzz/regressions/TARGET/): run first, as seeds.
  for f in "$ROOT"/fuzz/regressions/"$t"/*; do
    [[ -f $f ]] && cp "$f" "$CORPUS/$t/"
  done
  echo "fuzz/run.sh: $t: $(ls "$CORPUS/$t" | wc -l) seeds, ${SECONDS_TO_RUN}s"
  set +e
  "$OUT/$t" "$CORPUS/$t" -max_total_time="$SECONDS_TO_RUN" "${LIMITS[@]}" -max_len=262144 \
    -artifact_prefix="$OUT/artifacts/$t-" -print_final_stats=1
  rc=$?
  set -e
  if (( rc != 0 )); then
    echo "fuzz/run.sh: $t FAILED (libFuzzer exit $rc); reproducer in $OUT/artifacts/$t-*" >&2
    failed=1
  else
    echo "fuzz/run.sh: $t: no crash in ${SECONDS_TO_RUN}s"
  fi
done
exit "$failed"
