#include "cpu/kernels/packed_gemm.h"

#include <cpuid.h>
#include <hwy/aligned_allocator.h>
#include <hwy/cache_control.h>
#include <hwy/highway.h>
#include <immintrin.h>
#include <sys/mman.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "core/hash.h"
#include "core/prepared_store.h"
#include "graphfuse/dtype.h"
#include "cpu/kernels/gemm_tuning.h"
#include "cpu/kernels/kernel_util.h"
#include "cpu/kernels/sgemm.h"

namespace graphfuse::kernels {

std::unique_ptr<void, void (*)(void*)> AllocateWeightMemory(size_t bytes, bool huge_pages) {
  constexpr size_t kHuge = kHugePageBytes;
  if (!huge_pages || bytes < kHuge) return {std::aligned_alloc(128, (bytes + 127) / 128 * 128), std::free};
  const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, rounded);
  if (p) madvise(p, rounded, MADV_HUGEPAGE);  // advice: the kernel may decline (THP off)
  return {p, std::free};
}

int64_t L2Bytes() {
  static const int64_t bytes = [] {
    const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return v > 0 ? static_cast<int64_t>(v) : int64_t{2} << 20;
  }();
  return bytes;
}

namespace {

using dt = dnnl::memory::data_type;

// Columns per block: at least eight blocks (so that the blocks spread over the threads of a
// launch and a late thread takes fewer: 512-column blocks would leave an N=512 projection on
// one thread), at most 512 (an epilogue's block stays in L2), at least 64 (each call reads all
// of A).
// From M = 16 on, also at most L2 / 2 KiB (512 with 2 MiB of L2, 256 with 512 KiB): the width
// follows the L2, as 512-column blocks ran slower on a 512 KiB L2. Below M = 16 the calls are
// memory-bound row products whose number counts: 512 stays, or wider where a block would hold
// less than kMinStreamBlockBytes of weights and N leaves room for eight such blocks (a short K,
// LLaMA's lm_head with K = 1024 in bf16, would otherwise cut the stream into 1 MiB blocks, each
// starting its prefetch afresh, which read measurably slower). (The timings behind these widths:
// bench/history/2026-12.md, "Notes moved out of code comments", and issue 41's section.)
constexpr int64_t kMinStreamBlockBytes = int64_t{2} << 20;
int64_t BlockCols(int64_t m, int64_t k, int64_t n, int64_t weight_bytes) {
  const int64_t stream_cap = std::max<int64_t>(512, kMinStreamBlockBytes / (k * weight_bytes) / 16 * 16);
  const int64_t cap = m >= 16 ? std::clamp<int64_t>(L2Bytes() / 2048 / 16 * 16, 64, 512) : stream_cap;
  return std::clamp<int64_t>((n / 8 + 15) / 16 * 16, 64, cap);
}

// A packed layout's identity, for keying it in the store: the descriptor's bytes (oneDNN 2.x),
// or its dims, data type, strides and inner blocks (3.x, where the descriptor is a handle).
std::string LayoutOf(const dnnl::memory::desc& d) {
#if DNNL_VERSION_MAJOR >= 3
  std::string s = StrCat(static_cast<int>(d.get_data_type()), ":", d.get_size());
  for (auto v : d.get_dims()) s += StrCat(",", v);
  s += ";";
  for (auto v : d.get_strides()) s += StrCat(",", v);
  s += ";";
  for (auto v : d.get_inner_blks()) s += StrCat(",", v);
  s += ";";
  for (auto v : d.get_inner_idxs()) s += StrCat(",", v);
  return s;
#else
  return std::string(reinterpret_cast<const char*>(&d.data), sizeof(d.data));
#endif
}

// One row of `width` f32 values, broadcast over the rows of C (a bias).
dnnl::memory::desc RowDesc(int64_t width) { return dnnl::memory::desc({1, width}, dt::f32, {width, 1}); }

const dnnl::engine& Engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr int64_t kLanes = static_cast<int64_t>(HWY_LANES(float));
// Columns of a streamed panel: two vectors, so that M <= 8 rows keep 2M accumulators in
// registers (16 of AVX-512's 32; AVX2's 16 as well).
constexpr int64_t kStreamPanel = 2 * kLanes;
// How far ahead of its loads the stream asks for its weights (software prefetch): the hardware
// prefetcher alone stops at each 4 KiB page and left the decode GEMVs below the read bandwidth
// (bench/bench_gemm, M <= 4; bench/RESULTS.md).
constexpr int64_t kStreamAheadBytes = 2048;

}  // namespace

struct PackedGemm::Impl {
  int64_t m = 0, k = 0, n = 0, ldc = 0, block_cols = 0, blocks = 0;
  std::vector<PostOp> post_ops;
  bool bias = false;  // post_ops[0] is the matmul's bias
  WeightStorage storage = WeightStorage::kF32;
  // The own engine's weights: block b's panels from offset b * block_stride, panel q's K rows of
  // kStreamPanel values contiguous (columns past n zero). With `dot` (bf16 weights on a CPU with
  // AVX512-BF16, at any rows) each panel holds pairs of K rows instead, the two values
  // of a column side by side (K rounded up to even, the last pair's second row zero when K is
  // odd): the layout of the bf16 dot-product instruction.
  GemmEngine engine = GemmEngine::kOwn;
  bool dot = false;
  int64_t block_stride = 0;
  // The panels (shared through the model's store by every plan of the weights): one of f32 /
  // bf16 points into `memory`.
  struct Panels {
    std::unique_ptr<void, void (*)(void*)> memory{nullptr, std::free};
    float* f32 = nullptr;
    uint16_t* bf16 = nullptr;
  };
  std::shared_ptr<const Panels> panels;
  const float* stream_f32 = nullptr;
  const uint16_t* stream_bf16 = nullptr;
  // [0]: a full block, [1]: the last one when narrower.
  std::vector<dnnl::matmul::primitive_desc> pds;
  std::vector<dnnl::matmul> prims;
  std::vector<dnnl::memory> weights;  // one packed block each
  std::shared_ptr<const void> weights_owner;  // what holds them (the store's entry)
  size_t scratch_bytes = 0;
  size_t Which(int64_t width) const { return width == std::min(n, block_cols) ? 0 : 1; }
};

PackedGemm::PackedGemm() : impl_(std::make_unique<Impl>()) {}
PackedGemm::~PackedGemm() = default;
int64_t PackedGemm::blocks() const { return impl_->blocks; }
int64_t PackedGemm::block_cols() const { return impl_->block_cols; }
bool PackedGemm::streamed() const {
  return impl_->engine == GemmEngine::kOwn && impl_->m <= kStreamRows && !impl_->dot;
}
GemmEngine PackedGemm::engine() const { return impl_->engine; }
PackedGemm::WeightStorage PackedGemm::storage() const { return impl_->storage; }

namespace {

// Row i of C at columns [col, col + min(kLanes, valid)): the sums `r` through the post-ops, stored.
inline void StoreSums(const PackedGemm::Impl& p, VF r, int64_t i, int64_t col, int64_t valid, float* c,
                      std::span<const float* const> operands) {
  const DF df;
  const auto mask = hn::FirstN(df, static_cast<size_t>(std::min(kLanes, valid)));
  for (size_t o = 0; o < p.post_ops.size(); ++o) {
    const float* src = operands[o] + (p.post_ops[o].row ? 0 : i * p.ldc) + col;
    const VF x = hn::MaskedLoad(mask, df, src);
    r = p.post_ops[o].kind == PackedGemm::PostOp::Kind::kAdd ? hn::Add(r, x) : hn::Mul(r, x);
  }
  hn::BlendedStore(r, mask, df, c + i * p.ldc + col);
}

// f(std::integral_constant<int, R>{}) for R = r in 1..8 (8 past it): the row counts the stream
// and the tiles are compiled for.
template <typename F>
void ForRows(int64_t r, F&& f) {
  switch (r) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

// M rows of A against one block of streamed weights (W: float or bf16 bits), the post-ops
// applied as each panel is stored: C[i, j0 + j] for j < width.
template <int M, typename W>
void StreamBlock(const PackedGemm::Impl& p, const W* wb, int64_t width, int64_t j0, const float* a, float* c,
                 std::span<const float* const> operands) {
  const DF df;
  const hn::Rebind<hwy::bfloat16_t, DF> dbf;
  const int64_t k = p.k;
  auto load = [&](const W* w) {
    if constexpr (std::is_same_v<W, float>) {
      return hn::LoadU(df, w);
    } else {
      return hn::PromoteTo(df, hn::LoadU(dbf, reinterpret_cast<const hwy::bfloat16_t*>(w)));
    }
  };
  // P panels from panel q0 against the M rows: 2P vectors of columns, 2MP accumulators.
  auto run = [&](auto panels_at_once, int64_t q0) {
    constexpr int P = decltype(panels_at_once)::value;
    const W* wp = wb + q0 * k * kStreamPanel;
    VF acc[M][2 * P];
    for (int i = 0; i < M; ++i)
      for (int v = 0; v < 2 * P; ++v) acc[i][v] = hn::Zero(df);
    for (int64_t kk = 0; kk < k; ++kk) {
      VF w[2 * P];
      for (int q = 0; q < P; ++q) {
        const W* row = wp + (q * k + kk) * kStreamPanel;
        // Both cache lines of the row kStreamAheadBytes ahead (one line holds a bf16 row).
        hwy::Prefetch(reinterpret_cast<const char*>(row) + kStreamAheadBytes);
        hwy::Prefetch(reinterpret_cast<const char*>(row) + kStreamAheadBytes + 64);
        w[2 * q] = load(row), w[2 * q + 1] = load(row + kLanes);
      }
      for (int i = 0; i < M; ++i) {
        const VF x = hn::Set(df, a[i * k + kk]);
        for (int v = 0; v < 2 * P; ++v) acc[i][v] = hn::MulAdd(x, w[v], acc[i][v]);
      }
    }
    for (int v = 0; v < 2 * P; ++v) {
      const int64_t col = q0 * kStreamPanel + v * kLanes;  // within the block
      if (col >= width) break;
      for (int i = 0; i < M; ++i) StoreSums(p, acc[i][v], i, j0 + col, width - col, c, operands);
    }
  };
  // One row: two panels at once, two weight streams in flight.
  constexpr int kAtOnce = M == 1 ? 2 : 1;
  const int64_t panels = (width + kStreamPanel - 1) / kStreamPanel;
  int64_t q = 0;
  for (; q + kAtOnce <= panels; q += kAtOnce) run(std::integral_constant<int, kAtOnce>{}, q);
  for (; q < panels; ++q) run(std::integral_constant<int, 1>{}, q);
}

// Past the streaming rows each panel's K rows are taken in chunks of kTileK (kTileK x
// kStreamPanel f32, 32 KiB, read from L1 / L2 by every group of kTileRows rows of A in turn),
// the sums of all M rows kept in a per-thread buffer of M x kStreamPanel between chunks, and the
// chunk kAheadChunks on prefetched into L2 while the first row group runs, so that the weights
// keep streaming beside the FMAs. bf16 weights are widened once per chunk into an f32 copy.
constexpr int kTileRows = 8;
constexpr int64_t kTileK = 256;
constexpr int64_t kAheadChunks = 2;
constexpr int64_t kRowBlock = 64;

// R rows of A (lda apart, at the chunk's first column) against kc rows of a chunk of one panel:
// sums[R][kStreamPanel] += a @ w (set, not added to, when `first`). `ahead`, when not null, is
// the chunk to prefetch, `ahead_row` bytes a row.
template <int R>
void TileRows(const float* w, int64_t kc, const float* a, int64_t lda, float* sums, bool first, const char* ahead,
              int64_t ahead_row) {
  const DF df;
  VF acc[R][2];
  for (int i = 0; i < R; ++i) {
    acc[i][0] = first ? hn::Zero(df) : hn::Load(df, sums + i * kStreamPanel);
    acc[i][1] = first ? hn::Zero(df) : hn::Load(df, sums + i * kStreamPanel + kLanes);
  }
  for (int64_t kk = 0; kk < kc; ++kk) {
    if (ahead) {
      __builtin_prefetch(ahead + kk * ahead_row, 0, 2);
      if (ahead_row > 64) __builtin_prefetch(ahead + kk * ahead_row + 64, 0, 2);
    }
    const VF w0 = hn::Load(df, w + kk * kStreamPanel), w1 = hn::Load(df, w + kk * kStreamPanel + kLanes);
    for (int i = 0; i < R; ++i) {
      const VF x = hn::Set(df, a[i * lda + kk]);
      acc[i][0] = hn::MulAdd(x, w0, acc[i][0]);
      acc[i][1] = hn::MulAdd(x, w1, acc[i][1]);
    }
  }
  for (int i = 0; i < R; ++i) {
    hn::Store(acc[i][0], df, sums + i * kStreamPanel);
    hn::Store(acc[i][1], df, sums + i * kStreamPanel + kLanes);
  }
}

// With AVX512-BF16, bf16 weights run through tiles of bf16 dot products at any rows: each
// instruction multiplies a pair of K rows of the weights (16 columns) by the same pair of one row
// of A (rounded to bf16 once per GEMM, ConvertA) and adds both products to f32 sums, twice the
// work of a widened f32 FMA. The tiles are those of TileRows (R rows x 2 vectors, K in chunks),
// on weights packed in pairs of K rows (Impl::dot). Up to 8 rows they read the weights at the
// read bandwidth as the stream does, where the stream's widened FMAs could not keep up past 2-4
// rows.
#if defined(__AVX512BF16__)
constexpr bool kBf16Dot = true;
static_assert(kStreamPanel == 32, "the dot-product tiles are written for 16-lane vectors");

// R rows of A in bf16 (lda apart, at the chunk's first column) against kc rows (in pairs) of a
// chunk of one panel: sums[R][kStreamPanel] += a @ w (set when `first`); `ahead` as in TileRows.
template <int R>
void TileRowsDot(const uint16_t* w, int64_t kc, const uint16_t* a, int64_t lda, float* sums, bool first,
                 const char* ahead, int64_t ahead_row) {
  __m512 acc[R][2];
  for (int i = 0; i < R; ++i) {
    acc[i][0] = first ? _mm512_setzero_ps() : _mm512_load_ps(sums + i * kStreamPanel);
    acc[i][1] = first ? _mm512_setzero_ps() : _mm512_load_ps(sums + i * kStreamPanel + 16);
  }
  // One pair of K rows: A's pair of each row as one 32-bit lane (`x(i)`) times the weights' pair.
  auto step = [&](int64_t q, auto x) {
    if (ahead) {
      __builtin_prefetch(ahead + q * ahead_row, 0, 2);
      __builtin_prefetch(ahead + q * ahead_row + 64, 0, 2);
    }
    const __m512i w0 = _mm512_load_si512(w + q * 2 * kStreamPanel);
    const __m512i w1 = _mm512_load_si512(w + q * 2 * kStreamPanel + kStreamPanel);
    for (int i = 0; i < R; ++i) {
      const __m512i xi = _mm512_set1_epi32(static_cast<int>(x(i)));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)xi, (__m512bh)w0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], (__m512bh)xi, (__m512bh)w1);
    }
  };
  const int64_t pairs = kc / 2;
  for (int64_t q = 0; q < pairs; ++q) {
    step(q, [&](int i) {
      uint32_t pair;
      std::memcpy(&pair, a + i * lda + 2 * q, sizeof(pair));
      return pair;
    });
  }
  // An odd K's last row: the second half of A's pair is +0 (the weights' row there is zero too,
  // and A's next row may hold an infinity).
  if (kc % 2) step(pairs, [&](int i) { return uint32_t{a[i * lda + kc - 1]}; });
  for (int i = 0; i < R; ++i) {
    _mm512_store_ps(sums + i * kStreamPanel, acc[i][0]);
    _mm512_store_ps(sums + i * kStreamPanel + 16, acc[i][1]);
  }
}

// One row of A in bf16 (`a16`) against one block of weights in pairs of K rows: the decode row's
// stream with bf16 dot products, four panels at once (four weight streams in flight, eight
// accumulators), each pair row prefetched kStreamAheadBytes ahead into L1 as StreamBlock does.
// At one row the tiles (their L2 prefetch a chunk ahead) read the weights at 81-102% of the read
// bandwidth, two panels at once at 90-102%, four at 97-102% (bench_gemm, M = 1).
void StreamRowDot(const PackedGemm::Impl& p, const uint16_t* wb, int64_t width, int64_t j0, const uint16_t* a16,
                  float* c, std::span<const float* const> operands) {
  const int64_t k = p.k, pairs = (k + 1) / 2;
  const int64_t panel_elems = pairs * 2 * kStreamPanel;
  auto run = [&](auto panels_at_once, int64_t q0) {
    constexpr int P = decltype(panels_at_once)::value;
    const uint16_t* wp = wb + q0 * panel_elems;
    __m512 acc[2 * P];
    for (int v = 0; v < 2 * P; ++v) acc[v] = _mm512_setzero_ps();
    for (int64_t q = 0; q < pairs; ++q) {
      // A's pair of K rows as one 32-bit lane (an odd K's last: the second half +0, as the weights).
      uint32_t pair = a16[2 * q];
      if (2 * q + 1 < k) pair |= uint32_t{a16[2 * q + 1]} << 16;
      const __m512i x = _mm512_set1_epi32(static_cast<int>(pair));
      for (int pp = 0; pp < P; ++pp) {
        const uint16_t* row = wp + pp * panel_elems + q * 2 * kStreamPanel;
        hwy::Prefetch(reinterpret_cast<const char*>(row) + kStreamAheadBytes);
        hwy::Prefetch(reinterpret_cast<const char*>(row) + kStreamAheadBytes + 64);
        const __m512i w0 = _mm512_load_si512(row), w1 = _mm512_load_si512(row + kStreamPanel);
        acc[2 * pp] = _mm512_dpbf16_ps(acc[2 * pp], (__m512bh)x, (__m512bh)w0);
        acc[2 * pp + 1] = _mm512_dpbf16_ps(acc[2 * pp + 1], (__m512bh)x, (__m512bh)w1);
      }
    }
    for (int v = 0; v < 2 * P; ++v) {
      const int64_t col = q0 * kStreamPanel + v * kLanes;  // within the block
      if (col >= width) break;
      StoreSums(p, VF{acc[v]}, 0, j0 + col, width - col, c, operands);
    }
  };
  const int64_t panels = (width + kStreamPanel - 1) / kStreamPanel;
  int64_t q = 0;
  for (; q + 4 <= panels; q += 4) run(std::integral_constant<int, 4>{}, q);
  for (; q + 2 <= panels; q += 2) run(std::integral_constant<int, 2>{}, q);
  if (q < panels) run(std::integral_constant<int, 1>{}, q);
}

#else
constexpr bool kBf16Dot = false;
#endif

// All M rows of A against one block of packed weights, in tiles: W float or bf16 bits widened to
// f32 per chunk (A f32), or with kDot bf16 pairs of K rows in dot products (A: `a16`, bf16).
template <typename W, bool kDot = false>
void TiledBlock(const PackedGemm::Impl& p, const W* wb, int64_t width, int64_t j0, const float* a,
                const uint16_t* a16, float* c, std::span<const float* const> operands) {
  const DF df;
  const hn::Rebind<hwy::bfloat16_t, DF> dbf;
  const int64_t m = p.m, k = p.k;
  // Each panel's K rows, rounded up to pairs for the dot products.
  const int64_t panel_k = kDot ? (k + 1) / 2 * 2 : k;
  thread_local hwy::AlignedFreeUniquePtr<float[]> sums, wide;
  thread_local size_t sums_size = 0;
  const size_t need = static_cast<size_t>(std::min(m, kRowBlock) * kStreamPanel);
  if (sums_size < need) sums = hwy::AllocateAligned<float>(need), sums_size = need;
  if constexpr (!kDot && !std::is_same_v<W, float>) {
    if (!wide) wide = hwy::AllocateAligned<float>(static_cast<size_t>(kTileK * kStreamPanel));
  }
  const int64_t panels = (width + kStreamPanel - 1) / kStreamPanel;
  const W* end = wb + panels * panel_k * kStreamPanel;
  for (int64_t q = 0; q < panels; ++q) {
    const W* wp = wb + q * panel_k * kStreamPanel;
    for (int64_t rb = 0; rb < m; rb += kRowBlock) {
      const int64_t mb = std::min(kRowBlock, m - rb);
      for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
        const int64_t kc = std::min(kTileK, k - k0);
        const W* next = wp + (k0 + kAheadChunks * kTileK) * kStreamPanel;
        const char* ahead =
            rb == 0 && next + kc * kStreamPanel <= end ? reinterpret_cast<const char*>(next) : nullptr;
        if constexpr (kDot) {
#if defined(__AVX512BF16__)
          for (int64_t r0 = rb; r0 < rb + mb; r0 += kTileRows)
            ForRows(std::min<int64_t>(kTileRows, rb + mb - r0), [&](auto rows) {
              TileRowsDot<rows()>(wp + k0 * kStreamPanel, kc, a16 + r0 * k + k0, k,
                                  sums.get() + (r0 - rb) * kStreamPanel, k0 == 0, r0 == rb ? ahead : nullptr,
                                  static_cast<int64_t>(2 * kStreamPanel * sizeof(W)));
            });
#endif
        } else {
          const float* w;
          if constexpr (std::is_same_v<W, float>) {
            w = wp + k0 * kStreamPanel;
          } else {
            const auto* src = reinterpret_cast<const hwy::bfloat16_t*>(wp + k0 * kStreamPanel);
            for (int64_t e = 0; e < kc * kStreamPanel; e += kLanes)
              hn::Store(hn::PromoteTo(df, hn::LoadU(dbf, src + e)), df, wide.get() + e);
            w = wide.get();
          }
          for (int64_t r0 = rb; r0 < rb + mb; r0 += kTileRows)
            ForRows(std::min<int64_t>(kTileRows, rb + mb - r0), [&](auto rows) {
              TileRows<rows()>(w, kc, a + r0 * k + k0, k, sums.get() + (r0 - rb) * kStreamPanel, k0 == 0,
                               r0 == rb ? ahead : nullptr, static_cast<int64_t>(kStreamPanel * sizeof(W)));
            });
        }
      }
      for (int v = 0; v < 2; ++v) {
        const int64_t col = q * kStreamPanel + v * kLanes;  // within the block
        if (col >= width) break;
        for (int64_t i = 0; i < mb; ++i)
          StoreSums(p, hn::Load(df, sums.get() + i * kStreamPanel + v * kLanes), rb + i, j0 + col, width - col, c,
                    operands);
      }
    }
  }
}

}  // namespace

Result<std::shared_ptr<const PackedGemm>> PackedGemm::Create(int64_t m, int64_t k, int64_t n, const float* b_given,
                                                             int64_t ldb, int64_t ldc, std::vector<PostOp> post_ops,
                                                             const Options& options) {
  const int64_t block_cols = options.block_cols;
  const WeightStorage storage = options.storage;
  if (m <= 0 || k <= 0 || n <= 0) return InvalidArgument("packed GEMM of ", m, "x", n, "x", k, ": empty");
  if (options.engine == GemmEngine::kAuto) {
    Options chosen = options;
    const GemmChoice choice = ChooseGemmEngine(m, k, n, storage, options.one_form, options.tuning);
    chosen.engine = choice.engine;
    chosen.bf16_dot = options.bf16_dot && choice.bf16_dot;
    auto made = Create(m, k, n, b_given, ldb, ldc, post_ops, chosen);
    const bool refused = !made.ok() && made.status().code() == StatusCode::kUnimplemented;
    if (!refused || chosen.engine == GemmEngine::kOwn) return made;
    // oneDNN has no kernel for the case (only its reference matmul for bf16 on a CPU without bf16
    // instructions, or a row operand past the first post-op): the own loops take every case.
    chosen.engine = GemmEngine::kOwn;
    return Create(m, k, n, b_given, ldb, ldc, std::move(post_ops), chosen);
  }
  // B, made on demand when the options say so (only by a packing the store does not hold yet).
  auto source = [&] { return options.lazy_b ? options.lazy_b() : b_given; };
  std::shared_ptr<PackedGemm> g(new PackedGemm());
  Impl& p = *g->impl_;
  p.m = m, p.k = k, p.n = n, p.ldc = ldc, p.post_ops = std::move(post_ops), p.storage = storage;
  p.bias = !p.post_ops.empty() && p.post_ops[0].row && p.post_ops[0].kind == PostOp::Kind::kAdd;
  p.block_cols = block_cols > 0 ? std::min(block_cols, n)
                                : BlockCols(m, k, n, storage == WeightStorage::kBF16 ? 2 : 4);
  p.blocks = (n + p.block_cols - 1) / p.block_cols;
  const bool bf16 = storage == WeightStorage::kBF16;
  p.engine = options.engine;
  if (p.engine == GemmEngine::kOwn) {
    // Panels of kStreamPanel columns, each the K rows of its columns (zeros past the block), or
    // for the dot products pairs of K rows, each column's two values side by side (Impl::dot).
    p.dot = bf16 && kBf16Dot && options.bf16_dot;
    const int64_t panel_k = p.dot ? (k + 1) / 2 * 2 : k;
    p.block_stride = (p.block_cols + kStreamPanel - 1) / kStreamPanel * kStreamPanel * panel_k;
    const size_t total = static_cast<size_t>(p.block_stride * p.blocks);
    auto pack = [&]() -> Result<PreparedStore::Made> {
      const float* b = source();
      auto panels = std::make_shared<Impl::Panels>();
      panels->memory = AllocateWeightMemory(total * (bf16 ? sizeof(uint16_t) : sizeof(float)), options.huge_pages);
      if (!panels->memory) return ResourceExhausted("packing GEMM weights: ", total, " elements");
      if (bf16) panels->bf16 = static_cast<uint16_t*>(panels->memory.get());
      else panels->f32 = static_cast<float*>(panels->memory.get());
      for (int64_t blk = 0; blk < p.blocks; ++blk) {
        const int64_t j0 = blk * p.block_cols, width = std::min(p.block_cols, n - j0);
        if (!bf16 && !p.dot) {
          // f32 panels: each row of B's block is copied to its panels whole, a panel's width at a
          // time (the element loop below serves the bf16 and paired forms).
          const int64_t full = width / kStreamPanel;
          for (int64_t kk = 0; kk < k; ++kk) {
            const float* row = b + kk * ldb + j0;
            float* to = panels->f32 + blk * p.block_stride + kk * kStreamPanel;
            for (int64_t q = 0; q < full; ++q)
              std::memcpy(to + q * panel_k * kStreamPanel, row + q * kStreamPanel, kStreamPanel * sizeof(float));
            if (const int64_t tail = width - full * kStreamPanel; tail > 0) {
              float* t = to + full * panel_k * kStreamPanel;
              std::memcpy(t, row + full * kStreamPanel, static_cast<size_t>(tail) * sizeof(float));
              std::fill(t + tail, t + kStreamPanel, 0.f);
            }
          }
          continue;
        }
        // bf16 panels: row by row of B's block (a pair of rows for the dot products), a panel's
        // width at a time rounded to bf16 (ToBF16: SIMD), zeros past the block's width and K.
        const int64_t panels_n = (width + kStreamPanel - 1) / kStreamPanel;
        uint16_t row0[kStreamPanel], row1[kStreamPanel];
        auto round_row = [&](int64_t kk, int64_t q, uint16_t* to) {
          const int64_t valid = kk < k ? std::min(kStreamPanel, width - q * kStreamPanel) : 0;
          if (valid > 0) ToBF16(b + kk * ldb + j0 + q * kStreamPanel, valid, to);
          std::fill(to + valid, to + kStreamPanel, uint16_t{0});
        };
        for (int64_t kk = 0; kk < panel_k; kk += p.dot ? 2 : 1)
          for (int64_t q = 0; q < panels_n; ++q) {
            // Row kk of panel q; with the dot products, pair kk / 2, each column's two values side
            // by side (Impl::dot): the same offset, kk being even.
            uint16_t* to = panels->bf16 + blk * p.block_stride + (q * panel_k + kk) * kStreamPanel;
            if (!p.dot) {
              round_row(kk, q, to);
              continue;
            }
            round_row(kk, q, row0);
            round_row(kk + 1, q, row1);
            for (int64_t j = 0; j < kStreamPanel; ++j) to[2 * j] = row0[j], to[2 * j + 1] = row1[j];
          }
      }
      return PreparedStore::Made{panels, static_cast<int64_t>(total * (bf16 ? 2 : 4))};
    };
    const std::string key = options.weights_key.empty()
                                ? ""
                                : StrCat(options.weights_key, " panels k=", k, " n=", n, " block=", p.block_cols,
                                         bf16 ? " bf16" : " f32", p.dot ? " pairs" : "");
    GF_ASSIGN_OR_RETURN(std::shared_ptr<const void> made, GetOrMakeShared(options.store, key, pack));
    p.panels = std::static_pointer_cast<const Impl::Panels>(made);
    p.stream_f32 = p.panels->f32;
    p.stream_bf16 = p.panels->bf16;
    return std::shared_ptr<const PackedGemm>(std::move(g));
  }
  for (size_t i = p.bias ? 1 : 0; i < p.post_ops.size(); ++i)
    if (p.post_ops[i].row) return Unimplemented("packed GEMM: a row operand other than a first add (the bias)");
  // kBF16 at oneDNN's sizes: a bf16 x bf16 matmul summing in f32 (AVX512-BF16 / AMX where the
  // CPU has them); A is rounded to bf16 once per GEMM (ConvertA) or as each block reads it, the
  // weights once, here.
  const dt wdt = bf16 ? dt::bf16 : dt::f32;
  try {
    const OneOmpThread one_thread;
    dnnl::stream stream(Engine());
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // per-call scratch: concurrent blocks
    const int64_t widths[2] = {std::min(n, p.block_cols), n % p.block_cols};
    for (int64_t width : widths) {
      if (width == 0 || (p.pds.size() == 1 && widths[0] == width)) continue;
      // A row added first is the matmul's bias (added to the f32 product before any post-op, one
      // rounding, as an Add): oneDNN 2.6 runs a broadcast binary post-op only in its reference
      // matmul, a thousand times slower. The other operands are binary post-ops, R read as C
      // is written (for an Add, the sum post-op would add C into the running sum: another
      // rounding, and a copy of R).
      dnnl::post_ops ops;
      for (size_t i = p.bias ? 1 : 0; i < p.post_ops.size(); ++i) {
        ops.append_binary(p.post_ops[i].kind == PostOp::Kind::kAdd ? dnnl::algorithm::binary_add
                                                                   : dnnl::algorithm::binary_mul,
                          dnnl::memory::desc({m, width}, dt::f32, {ldc, 1}));
      }
      if (ops.len() > 0) attr.set_post_ops(ops);
      dnnl::memory::desc src_md({m, k}, wdt, {k, 1});
      dnnl::memory::desc wei_md({k, width}, wdt, dnnl::memory::format_tag::any);
      dnnl::memory::desc dst_md({m, width}, dt::f32, {ldc, 1});
#if DNNL_VERSION_MAJOR >= 3
      p.pds.push_back(p.bias ? dnnl::matmul::primitive_desc(Engine(), src_md, wei_md, RowDesc(width), dst_md, attr)
                             : dnnl::matmul::primitive_desc(Engine(), src_md, wei_md, dst_md, attr));
#else
      p.pds.emplace_back(p.bias ? dnnl::matmul::desc(src_md, wei_md, RowDesc(width), dst_md)
                                : dnnl::matmul::desc(src_md, wei_md, dst_md),
                         attr, Engine());
#endif
      if ((!p.post_ops.empty() || bf16) && std::string(p.pds.back().impl_info_str()).rfind("ref", 0) == 0)
        return Unimplemented("packed GEMM: oneDNN has only its reference matmul for ",
                             bf16 ? "bf16 on this CPU" : "these post-ops", " here");
      p.prims.emplace_back(p.pds.back());
      p.scratch_bytes = std::max(p.scratch_bytes, p.pds.back().scratchpad_desc().get_size());
    }
    // The blocks in oneDNN's layout for these primitives (shared through the model's store,
    // keyed by the layout: a plan for other rows whose primitives take the same one reuses them).
    struct Blocks {
      std::vector<dnnl::memory::desc> descs;  // per Which(width)
      std::vector<dnnl::memory> weights;
      std::vector<std::unique_ptr<void, void (*)(void*)>> memory;  // theirs (AllocateWeightMemory)
    };
    auto pack = [&]() -> Result<PreparedStore::Made> {
      const float* b = source();
      auto blocks = std::make_shared<Blocks>();
      int64_t bytes = 0;
      for (const auto& pd : p.pds) blocks->descs.push_back(pd.weights_desc());
      for (int64_t blk = 0; blk < p.blocks; ++blk) {
        const int64_t j0 = blk * p.block_cols, width = std::min(p.block_cols, n - j0);
        const dnnl::memory::desc desc = p.pds[p.Which(width)].weights_desc();
        blocks->memory.push_back(AllocateWeightMemory(desc.get_size(), options.huge_pages));
        if (!blocks->memory.back()) return ResourceExhausted("packing GEMM weights: ", desc.get_size(), " bytes");
        dnnl::memory packed(desc, Engine(), blocks->memory.back().get());
        dnnl::memory plain({{k, width}, dt::f32, {ldb, 1}}, Engine(), const_cast<float*>(b + j0));
        dnnl::reorder(plain, packed).execute(stream, plain, packed);
        stream.wait();
        bytes += static_cast<int64_t>(packed.get_desc().get_size());
        blocks->weights.push_back(std::move(packed));
      }
      return PreparedStore::Made{blocks, bytes};
    };
    std::string key;
    if (!options.weights_key.empty()) {
      key = StrCat(options.weights_key, " onednn k=", k, " n=", n, " block=", p.block_cols);
      for (const auto& pd : p.pds) key += StrCat(" ", Hash8(LayoutOf(pd.weights_desc())));
    }
    GF_ASSIGN_OR_RETURN(std::shared_ptr<const void> made, GetOrMakeShared(options.store, key, pack));
    // A layout hash that matched another layout would have packed in another form: pack here.
    const auto* blocks = static_cast<const Blocks*>(made.get());
    for (size_t i = 0; i < p.pds.size(); ++i)
      if (!(blocks->descs[i] == p.pds[i].weights_desc())) {
        GF_ASSIGN_OR_RETURN(made, GetOrMakeShared(nullptr, "", pack));
        break;
      }
    p.weights = static_cast<const Blocks*>(made.get())->weights;
    p.weights_owner = std::move(made);
  } catch (const dnnl::error& e) {
    // No implementation at all for the case on this CPU (oneDNN 2.6's bf16 matmul below
    // AVX-512): Unimplemented, which kAuto answers with the own loops.
    if (e.status == dnnl_unimplemented)
      return Unimplemented("packed GEMM (", m, "x", n, "x", k, "): oneDNN has no matmul for ",
                           bf16 ? "bf16 weights" : "these operands", " on this CPU (", e.what(), ")");
    return Internal("packing GEMM weights (", m, "x", n, "x", k, ") with oneDNN: ", e.what());
  }
  return std::shared_ptr<const PackedGemm>(std::move(g));
}

GemmEngine PackedGemm::AutoEngine(int64_t m, WeightStorage storage, const char** why, bool one_form) {
  // Measured with bench/bench_gemm on the LLaMA-7B and GPT-2 shapes (bench/RESULTS.md, "The
  // GEMMs by shape"): up to 8 rows the weights' read sets the time and the own stream reads at
  // the read bandwidth, oneDNN 2.6 at 24-75% of it; from 9 to 63 rows in f32 the own tiles keep the
  // weights streaming beside the FMAs; from 64 rows the FMAs alone set it and oneDNN's kernels are
  // a few percent faster. With bf16 weights the own dot-product tiles read the weights at the read
  // bandwidth up to 8 rows, ran 1.0-3.3x oneDNN 2.6's bf16 matmul from 9 to 64 rows and 0.97-1.11x
  // at 128 (AVX512-BF16, no AMX); with AMX, oneDNN's matmul runs its tile instructions, which no
  // own loop has.
  GemmEngine e = GemmEngine::kOwn;
  const bool bf16 = storage == WeightStorage::kBF16;
  const char* reason = bf16 && OwnBf16Dot() ? "own bf16 dot-product tiles: up to 8 rows the weights' read sets the time"
                                            : "own stream: up to 8 rows the weights' read sets the time";
  if (m > kStreamRows && bf16) {
    if (CpuHasAmxBf16()) {
      e = GemmEngine::kOneDnn, reason = "oneDNN bf16 matmul: AMX tiles past 8 rows";
    } else if (OwnBf16Dot()) {
      reason = "own bf16 dot-product tiles: past 8 rows with bf16 weights (AVX512-BF16)";
    } else if (kLanes >= 16) {
      e = GemmEngine::kOneDnn, reason = "oneDNN bf16 matmul: past 8 rows, without bf16 dot products";
    } else {
      // oneDNN 2.6 has only its reference bf16 matmul below AVX-512.
      reason = "own tiles, bf16 weights widened to f32: no bf16 instructions";
    }
  } else if (m >= kOneDnnRowsF32 && one_form) {
    // The decode stream needs the own panels anyway; at 128 rows the own tiles measured as fast
    // as oneDNN 2.6 on the f32 LLaMA shapes (bench/RESULTS.md, "The GEMMs by shape").
    reason = "own tiles: the model's row counts vary, and its panels serve every one (one packed copy)";
  } else if (m >= kOneDnnRowsF32) {
    e = GemmEngine::kOneDnn, reason = "oneDNN matmul: from 64 rows the FMAs alone set the time";
  } else if (m > kStreamRows) {
    reason = "own tiles: from 9 to 63 rows the weights stream beside the FMAs";
  }
  if (why) *why = reason;
  return e;
}

bool CpuHasAmxBf16() {
  static const bool amx = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    // CPUID leaf 7, sub-leaf 0: EDX bit 22 is AMX-BF16.
    return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 22 & 1u);
  }();
  return amx;
}

void RunPackedBlocks(const CpuContext& cpu, const PackedGemm& g, int64_t work, const float* a, float* c) {
  const int threads = cpu.pool ? static_cast<int>(std::min<int64_t>(cpu.ThreadsFor(work), g.blocks())) : 1;
  thread_local std::vector<uint16_t> a16_buf;  // bf16 weights past the streaming rows: A converted once
  const uint16_t* a16p = g.ConvertA(a, a16_buf);
  ForEachClaimed(cpu, threads, g.blocks(), [&](int64_t blk, int) { g.RunBlock(blk, a, c, {}, a16p); });
}

std::string DescribePackedGemm(int64_t m, int64_t k, int64_t n, const PrepareOptions& options) {
  const GemmWeightStorage storage = WeightStorageFor(options);
  std::string why;
  switch (EngineFor(options)) {
    case GemmEngine::kOwn: why = "own loops, as the target's options force (--cpu-gemm own)"; break;
    case GemmEngine::kOneDnn: why = "oneDNN matmul, as the target's options force (--cpu-gemm onednn)"; break;
    case GemmEngine::kAuto:
      why = ChooseGemmEngine(m, k, n, storage, OneFormFor(options), TuningFor(options)).why;
      if (options.gemm_engine == CpuGemmEngine::kRule) why += " (the rule: --cpu-gemm rule)";
      break;
  }
  return StrCat(m, "x", k, " @ ", k, "x", n, " (", storage == GemmWeightStorage::kBF16 ? "bf16" : "f32",
                " weights, packed once): ", why);
}

bool PackedGemm::ReadsA16() const {
  return impl_->dot || (impl_->storage == WeightStorage::kBF16 && impl_->engine == GemmEngine::kOneDnn);
}

bool PackedGemm::OwnBf16Dot() { return kBf16Dot; }

const uint16_t* PackedGemm::ConvertA(const float* a, std::vector<uint16_t>& buf) const {
  if (!ReadsA16()) return nullptr;
  buf.resize(static_cast<size_t>(impl_->m * impl_->k));
  ToBF16(a, impl_->m * impl_->k, buf.data());
  return buf.data();
}

void PackedGemm::ToBF16(const float* a, int64_t n, uint16_t* out) {
  // Round to nearest even, as F32ToBF16Bits: bits + 0x7fff + lsb, the top half.
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> d16;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const VF v = hn::LoadU(df, a + i);
    const auto bits = hn::BitCast(du, v);
    const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
    const auto rounded = hn::ShiftRight<16>(hn::Add(bits, hn::Add(lsb, hn::Set(du, 0x7fffu))));
    const auto quiet = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x40u));
    const auto top = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, rounded);
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, top)), d16, out + i);
  }
  for (; i < n; ++i) out[i] = F32ToBF16Bits(a[i]);
}

void PackedGemm::RunBlock(int64_t block, const float* a, float* c, std::span<const float* const> operands,
                          const uint16_t* a_bf16) const {
  const Impl& p = *impl_;
  const int64_t j0 = block * p.block_cols;
  const int64_t width = std::min(p.block_cols, p.n - j0);
  GF_CHECK(operands.size() == p.post_ops.size(), "packed GEMM block: ", operands.size(), " operands for ",
           p.post_ops.size(), " post-ops");
  // A in bf16 where the blocks read it so: as given, or converted here for this block.
  thread_local std::vector<uint16_t> a16_buf;
  const uint16_t* a16 = !ReadsA16() ? nullptr : a_bf16 ? a_bf16 : ConvertA(a, a16_buf);
  if (p.engine == GemmEngine::kOwn) {
    const size_t at = static_cast<size_t>(block * p.block_stride);
    if (streamed() && p.stream_bf16) {
      ForRows(p.m, [&](auto rows) { StreamBlock<rows()>(p, p.stream_bf16 + at, width, j0, a, c, operands); });
    } else if (streamed()) {
      ForRows(p.m, [&](auto rows) { StreamBlock<rows()>(p, p.stream_f32 + at, width, j0, a, c, operands); });
    } else if (p.dot && p.m == 1) {
#if defined(__AVX512BF16__)
      StreamRowDot(p, p.stream_bf16 + at, width, j0, a16, c, operands);
#endif
    } else if (p.dot) {
      TiledBlock<uint16_t, true>(p, p.stream_bf16 + at, width, j0, a, a16, c, operands);
    } else if (p.stream_bf16) {
      TiledBlock(p, p.stream_bf16 + at, width, j0, a, nullptr, c, operands);
    } else {
      TiledBlock(p, p.stream_f32 + at, width, j0, a, nullptr, c, operands);
    }
    return;
  }
  const size_t which = p.Which(width);
  const OneOmpThread one_thread;
  thread_local dnnl::stream stream(Engine());
  thread_local std::vector<char> scratch;
  if (scratch.size() < p.scratch_bytes) scratch.resize(p.scratch_bytes);
  const dnnl::matmul::primitive_desc& pd = p.pds[which];
  // The bf16 matmul reads A rounded to bf16.
  void* src_data = a16 ? static_cast<void*>(const_cast<uint16_t*>(a16)) : static_cast<void*>(const_cast<float*>(a));
  dnnl::memory src(pd.src_desc(), Engine(), src_data);
  dnnl::memory dst(pd.dst_desc(), Engine(), c + j0);
  dnnl::memory pad(pd.scratchpad_desc(), Engine(), scratch.data());
  std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, src},
                                                {DNNL_ARG_WEIGHTS, p.weights[static_cast<size_t>(block)]},
                                                {DNNL_ARG_DST, dst},
                                                {DNNL_ARG_SCRATCHPAD, pad}};
  if (p.bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(RowDesc(width), Engine(), const_cast<float*>(operands[0] + j0)));
  for (size_t i = p.bias ? 1 : 0; i < p.post_ops.size(); ++i)
    args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(static_cast<int>(i - (p.bias ? 1 : 0))) | DNNL_ARG_SRC_1,
                 dnnl::memory(pd.dst_desc(), Engine(), const_cast<float*>(operands[i] + j0)));
  p.prims[which].execute(stream, args);
  stream.wait();
}

}  // namespace graphfuse::kernels
