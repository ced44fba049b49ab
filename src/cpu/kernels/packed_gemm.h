// GEMMs against constant weights packed once, when the plan is compiled (into panels for the
// own loops, or into the layout oneDNN's matmul prefers), so no call repacks the weights: a
// BLAS sgemm spent about half of a LLaMA-7B block at M=32 packing them on every call (perf),
// and packing once gains most at decode (M=1): bench/history/2026-12.md, "Notes moved out of
// code comments".
//
// The columns are cut into fixed blocks; RunBlock computes one block on the calling thread
// (oneDNN's own OpenMP threading is held to one thread there), so the caller spreads blocks
// over graphfuse's pool: one thread pool, as everywhere else.
//
// Up to kStreamRows rows of A (decode, small batches) the product is a stream of the weights
// with a few FMAs per element, bound by memory bandwidth: there the weights are packed into
// panels of kStreamPanel columns, each panel's K rows contiguous, and the block's panels run
// through one loop of our own (A's rows broadcast, M x 2 vector accumulators, the post-ops
// applied as each panel is stored), which reads the weights in one sequential pass. With
// bf16 weights (WeightStorage::kBF16: rounded to nearest even once, when packed) that stream is
// half as long; each element is widened to f32 as it is loaded and the sums stay f32 (on a CPU
// with AVX512-BF16 the dot-product tiles below take bf16 weights at every rows instead).
//
// Past those rows the FMAs set the time more and more: the same panels run through tiles of
// our own (8 rows x 2 vectors, K in chunks, rows in blocks of 64), or oneDNN's packed matmul,
// whichever was timed faster on this machine (gemm_tuning.h; else the rule, AutoEngine).
// With bf16 weights on a CPU with AVX512-BF16 the own tiles are bf16 dot products, on weights
// packed in pairs of K rows, unless widening the weights to f32 was timed faster (bf16_dot);
// the dot products, and oneDNN's bf16 matmul, read A rounded to bf16.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graphfuse/status.h"
#include "cpu/kernel_registry.h"
#include "core/prepared_store.h"

namespace graphfuse::kernels {

// How PackedGemm holds its weights.
enum class GemmWeightStorage { kF32, kBF16 };
// Rows of A up to which the weights are streamed by our own loop (see above).
inline constexpr int64_t kGemmStreamRows = 8;
// Rows of A from which kAuto takes oneDNN's f32 matmul (PackedGemm::AutoEngine).
inline constexpr int64_t kOneDnnRowsF32 = 64;

// Which code computes the products: graphfuse's own loops over panels packed for them (the
// stream up to kGemmStreamRows rows, the tiles past them) or oneDNN's packed matmul. kAuto takes
// the one timed faster on this machine (GemmTuning::measure, gemm_tuning.h) or else the rule
// (PackedGemm::AutoEngine), and the own loops where oneDNN has no kernel.
enum class GemmEngine { kAuto, kOwn, kOneDnn };

// How kAuto chooses (gemm_tuning.h).
struct GemmTuning {
  bool measure = false;   // time the engines (cached per machine); false: the rule
  int threads = 0;        // the threads the plan runs on (0: the hardware's)
  std::string cache_dir;  // empty: UserCacheDir("gemm")
};

struct PackedGemmOptions {
  int64_t block_cols = 0;  // > 0: the width of the column blocks (else BlockCols in packed_gemm.cc)
  GemmWeightStorage storage = GemmWeightStorage::kF32;  // kBF16: B rounded to bf16 once, when packed
  GemmEngine engine = GemmEngine::kAuto;
  // bf16 weights in the own loops: dot products where the build has them (OwnBf16Dot); false
  // widens the weights to f32 as on a CPU without them (the tests run both).
  bool bf16_dot = true;
  // Where the packed weights are kept: with a store and a key naming B (its tensor and where
  // this GEMM's columns start in it), every PackedGemm of the same B and layout shares one
  // packed copy (the model's store: every plan of the model); else this one owns its copy.
  PreparedStore* store = nullptr;
  std::string weights_key = {};
  // B made on demand (Create's `b` is then ignored): called only when this packing is not in the
  // store already, so that a plan whose packing another plan made skips gathering B.
  std::function<const float*()> lazy_b = {};
  // kAuto takes the engine whose packed form serves every row count (the own loops) wherever the
  // other would be a second packed copy of B: set for the plans of a model whose row counts vary
  // (PreparedStore::shapes_vary). f32 weights only: with bf16 weights on AMX, oneDNN's tiles are
  // worth their own copy past the stream's rows.
  bool one_form = false;
  GemmTuning tuning = {};
  // Packed weights of kHugePageBytes or more in transparent huge pages (AllocateWeightMemory).
  bool huge_pages = true;
};

class PackedGemm {
 public:
  static constexpr int64_t kStreamRows = kGemmStreamRows;
  using WeightStorage = GemmWeightStorage;
  using Options = PackedGemmOptions;
  // What the GEMM does with further operands as it stores each block, in order: C = ((A @ B)
  // op1 R1) op2 R2 ..., op an Add or a Mul, each R [m, n] laid out as C (leading dimension ldc;
  // oneDNN's binary post-ops), except that the first may be an Add of one row of n values
  // broadcast over the rows (a bias: oneDNN's matmul bias; Create refuses a row anywhere else).
  // The product is rounded to f32 first and each step's result once more, so C has the bits of
  // MatMul, then each Add / Mul run one by one.
  struct PostOp {
    enum class Kind { kAdd, kMul };
    Kind kind = Kind::kAdd;
    bool row = false;  // an [n] vector broadcast over the rows, else [m, n] laid out as C
  };
  // C[m, n] = A[m, k] @ B[k, n]; B read with leading dimension ldb (copied: B may go away),
  // A with lda = k, C written with leading dimension ldc. The own loops take a row operand at
  // any place among the post-ops; oneDNN only as the first.
  static Result<std::shared_ptr<const PackedGemm>> Create(int64_t m, int64_t k, int64_t n, const float* b, int64_t ldb,
                                                          int64_t ldc, std::vector<PostOp> post_ops = {},
                                                          const Options& options = {});
  ~PackedGemm();
  int64_t blocks() const;
  int64_t block_cols() const;  // every block but the last one
  bool streamed() const;  // run by the weight-streaming loop (own engine, m <= kStreamRows, no dot products)
  GemmEngine engine() const;   // kOwn or kOneDnn
  WeightStorage storage() const;
  // The engine kAuto takes for m rows of A with these weights, and why, in a few words
  // (`one_form`: PackedGemmOptions::one_form).
  static GemmEngine AutoEngine(int64_t m, WeightStorage storage, const char** why = nullptr, bool one_form = false);
  // Columns [block * block_cols(), ...) of C, reading the same columns of each post-op's
  // operand (operands[i] for post_ops[i], at its column 0; an [m, n] one may be C itself).
  // Where the blocks read A in bf16 (ReadsA16), `a_bf16` is A already converted (ConvertA, once
  // per GEMM for all its blocks); nullptr converts it here, per block. Else it is not read.
  void RunBlock(int64_t block, const float* a, float* c, std::span<const float* const> operands = {},
                const uint16_t* a_bf16 = nullptr) const;
  // Whether the blocks read A rounded to bf16 (bf16 weights in the own dot-product tiles or
  // oneDNN's bf16 matmul).
  bool ReadsA16() const;
  // Whether the own tiles run bf16 weights as bf16 dot products (a build for AVX512-BF16); else
  // they widen the weights to f32.
  static bool OwnBf16Dot();
  // A as the blocks read it: when they read it in bf16, A converted once into `buf` (for every
  // block of one GEMM: pass it to RunBlock); else nullptr.
  const uint16_t* ConvertA(const float* a, std::vector<uint16_t>& buf) const;
  // a[0, n) rounded to bf16 (nearest even; NaN stays a quiet NaN) into out.
  static void ToBF16(const float* a, int64_t n, uint16_t* out);

  struct Impl;  // packed_gemm.cc (named here for its streaming loop's helpers)

 private:
  PackedGemm();
  std::unique_ptr<Impl> impl_;
};

// C = A @ B with no post-ops: every block of `g` spread over cpu's pool, one claim at a time, A
// converted once where the blocks read it in bf16; `work` sizes the launch (CpuContext::ThreadsFor:
// multiply-adds / 8).
void RunPackedBlocks(const CpuContext& cpu, const PackedGemm& g, int64_t work, const float* a, float* c);

// One line for `graphfuse explain`: the engine that runs an m x k x n GEMM against constant
// weights as a plan with these options packs them, and why (timed: ChooseGemmEngine, which
// times it here if no plan has; the rule: PackedGemm::AutoEngine; or the engine the options
// force).
std::string DescribePackedGemm(int64_t m, int64_t k, int64_t n, const PrepareOptions& options);
// The library that runs the GEMMs of two activations (attention's products, a MatMul whose
// second operand is computed), in the same lines.
inline constexpr const char* kActivationGemms = "oneDNN sgemm per call";

// The weight storage a plan's options ask for.
inline GemmWeightStorage WeightStorageFor(const PrepareOptions& o) {
  return o.bf16_weights ? GemmWeightStorage::kBF16 : GemmWeightStorage::kF32;
}

// Whether a plan's GEMMs keep one packed form per weight for every row count (PackedGemmOptions::
// one_form): its model's plans serve different shapes.
inline bool OneFormFor(const PrepareOptions& o) { return o.store && o.store->shapes_vary(); }

// The engine a plan's options force, or kAuto.
inline GemmEngine EngineFor(const PrepareOptions& o) {
  switch (o.gemm_engine) {
    case CpuGemmEngine::kOwn: return GemmEngine::kOwn;
    case CpuGemmEngine::kOneDnn: return GemmEngine::kOneDnn;
    case CpuGemmEngine::kAuto:
    case CpuGemmEngine::kRule: break;
  }
  return GemmEngine::kAuto;
}

// How kAuto chooses for a plan with these options: timed unless they ask for the rule.
inline GemmTuning TuningFor(const PrepareOptions& o) {
  return {.measure = o.gemm_engine == CpuGemmEngine::kAuto, .threads = o.threads, .cache_dir = {}};
}

// How a plan packs the constant weights `w` read from `where` on (a column offset, a gather of
// columns: whatever tells two packings of w apart): the storage the plan's options ask for, and
// the model's store where it knows w, so that every plan of the model shares the packed copy.
inline PackedGemmOptions PackOptionsFor(const PrepareOptions& o, const Tensor& w, const std::string& where) {
  PackedGemmOptions p;
  p.storage = WeightStorageFor(o);
  p.engine = EngineFor(o);
  p.one_form = OneFormFor(o);
  p.tuning = TuningFor(o);
  if (o.store && o.store->Knows(&w)) {
    p.store = o.store;
    p.weights_key = PreparedStore::Id(&w) + " " + where;
  }
  return p;
}

// Memory for packed weights (freed with std::free). With `huge_pages`, from kHugePageBytes up it
// is aligned to that and asked to be backed by transparent huge pages (madvise; the kernel may
// decline, as where THP is off): a stream over 180 MB of weights then walks 2 MiB pages, not
// 4 KiB ones, 512 times fewer TLB entries. Else, and below that size, cache-line aligned.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;
std::unique_ptr<void, void (*)(void*)> AllocateWeightMemory(size_t bytes, bool huge_pages);

// Whether the CPU has AMX-BF16 (CPUID), whose tile instructions oneDNN's bf16 matmul uses.
bool CpuHasAmxBf16();

// The per-core L2 size in bytes (glibc reads it from CPUID); 2 MiB where it is not known. The
// packed blocks' widths and the attention's head groups scale with it.
int64_t L2Bytes();

}  // namespace graphfuse::kernels
