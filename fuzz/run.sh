#!/usr/bin/env bash
# Builds the ONNX-import fuzzer (libFuzzer + ASan + UBSan, clang++ 14) against the project's
# sources and runs it for a bounded time, seeded with the ONNX node-test models.
#
#   fuzz/run.sh                 build + fuzz for 60 s
#   GF_FUZZ_SECONDS=600 fuzz/run.sh
#   fuzz/run.sh CRASH_FILE...   build + replay the given inputs (regression check)
#   GF_FUZZ_CXXFLAGS=-DGF_FUZZ_NO_PRINT fuzz/run.sh   fuzz the importer without the printer
#
# Exits non-zero when the fuzzer finds a crash, a sanitizer error, a timeout or an
# out-of-memory; the reproducer is left in $GF_FUZZ_OUT/artifacts/.
#
# Debian packages: clang-14, libclang-rt-14-dev (libFuzzer and the sanitizer runtimes),
# libonnx-dev, libprotobuf-dev, libhwy-dev, libsleef-dev, libopenblas-dev, libonnx-testdata
# (seed corpus; optional).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${GF_FUZZ_OUT:-$ROOT/build/fuzz}
SECONDS_TO_RUN=${GF_FUZZ_SECONDS:-60}
SEED_DIR=${GF_FUZZ_SEEDS:-/usr/share/libonnx-testdata/data/node}
MAX_SEEDS=${GF_FUZZ_MAX_SEEDS:-400}
CXX=${GF_FUZZ_CXX:-clang++-14}

command -v "$CXX" >/dev/null || { echo "fuzz/run.sh: $CXX not found (apt install clang-14)" >&2; exit 2; }
if ! ls /usr/lib/llvm-14/lib/clang/14*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  echo "fuzz/run.sh: libFuzzer runtime missing (apt install libclang-rt-14-dev)" >&2
  exit 2
fi

mkdir -p "$OUT/obj" "$OUT/artifacts"

# Everything the importer reaches: the IR (graph, registry, printer), every op's schema and
# kernel (the registry links them), the op table and the CPU code under it.
mapfile -t SRCS < <(ls "$ROOT"/src/core/*.cc "$ROOT"/src/ops/*.cc "$ROOT"/src/ops/kernels/*.cc \
                       "$ROOT"/src/cpu/*.cc "$ROOT"/src/ir/*.cc "$ROOT"/src/onnx/*.cc 2>/dev/null)
SRCS+=("$ROOT/fuzz/fuzz_onnx_import.cc")

CXXFLAGS=(-std=c++20 -O1 -g -fno-omit-frame-pointer -march=native -ffp-contract=off
          -fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined
          -DHWY_COMPILE_ONLY_STATIC=1 -DONNX_NAMESPACE=onnx -DONNX_ML=1
          -I"$ROOT/include" -I"$ROOT/src")
read -r -a EXTRA <<<"${GF_FUZZ_CXXFLAGS:-}"  # e.g. -DGF_FUZZ_NO_PRINT to fuzz the importer alone
CXXFLAGS+=("${EXTRA[@]}")
read -r -a PKG_CFLAGS <<<"$(pkg-config --cflags libhwy sleef 2>/dev/null || true)"
read -r -a PKG_LIBS <<<"$(pkg-config --libs libhwy sleef)"

# Compile in parallel. An object is rebuilt when its source, any header, or this script is
# newer than it (coarse, but the build is a minute at most).
STAMP=$(find "$ROOT/include" "$ROOT/src" "$ROOT/fuzz" \( -name '*.h' -o -name '*.def' -o -name run.sh \) \
          -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
compile() {  # compile SRC: prints the object path, or fails
  local src=$1 obj
  obj="$OUT/obj/$(printf '%s' "${src#"$ROOT"/}" | tr '/' '_').o"
  if [[ ! -f $obj || $src -nt $obj || $STAMP -nt $obj ]]; then
    "$CXX" "${CXXFLAGS[@]}" "${PKG_CFLAGS[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$obj" >&2 || return 1
  fi
  printf '%s\n' "$obj"
}
OBJS=()
PIDS=()
TMPLIST=$(mktemp -d /tmp/gf_fuzz_objs.XXXXXX)
i=0
for src in "${SRCS[@]}"; do
  compile "$src" >"$TMPLIST/$i" &
  PIDS+=($!)
  i=$((i + 1))
  if (( ${#PIDS[@]} >= $(nproc) )); then wait "${PIDS[0]}" || { echo "fuzz/run.sh: compile failed" >&2; exit 2; }; PIDS=("${PIDS[@]:1}"); fi
done
for p in "${PIDS[@]}"; do wait "$p" || { echo "fuzz/run.sh: compile failed" >&2; exit 2; }; done
for ((k = 0; k < i; k++)); do OBJS+=("$(cat "$TMPLIST/$k")"); done
rm -rf "$TMPLIST"

BIN="$OUT/fuzz_onnx_import"
"$CXX" -fsanitize=fuzzer,address,undefined -fno-sanitize=vptr "${OBJS[@]}" -o "$BIN" \
  -lonnx_proto -lprotobuf "${PKG_LIBS[@]}" -lopenblas -lmvec -lm -lpthread

export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}

if (( $# > 0 )); then  # replay mode
  exec "$BIN" -rss_limit_mb=2048 -timeout=10 "$@"
fi

CORPUS=$(mktemp -d /tmp/gf_fuzz_corpus.XXXXXX)
trap 'rm -rf "$CORPUS"' EXIT
# Seeds: the node-test models (small ones first, up to MAX_SEEDS) and the exported models.
if [[ -d $SEED_DIR ]]; then
  find "$SEED_DIR" -name model.onnx -size -64k -printf '%s %p\n' | sort -n | awk -v n="$MAX_SEEDS" 'NR <= n' |
    while read -r _ f; do cp "$f" "$CORPUS/$(basename "$(dirname "$f")").onnx"; done
fi
for f in "$ROOT"/tests/models/*/model.onnx; do
  [[ -f $f ]] && cp "$f" "$CORPUS/$(basename "$(dirname "$f")").onnx"
done
echo "fuzz/run.sh: $(ls "$CORPUS" | wc -l) seeds, ${SECONDS_TO_RUN}s"

set +e
"$BIN" "$CORPUS" -max_total_time="$SECONDS_TO_RUN" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 \
  -max_len=262144 -artifact_prefix="$OUT/artifacts/" -print_final_stats=1
rc=$?
set -e
if (( rc != 0 )); then
  echo "fuzz/run.sh: FAILED (libFuzzer exit $rc); reproducer(s) in $OUT/artifacts/" >&2
  exit 1
fi
echo "fuzz/run.sh: no crash in ${SECONDS_TO_RUN}s"
