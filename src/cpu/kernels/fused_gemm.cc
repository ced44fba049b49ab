// FusedGemm: S projections of one input through concatenated weights, with an elementwise
// epilogue, in one kernel (src/passes/fuse_gemm.cc forms these nodes).
//
//   inputs:  A [..., K], W [K, S*N] (projection s = columns [s*N, (s+1)*N)), extras...
//   attrs:   splits = S
//            out_proj = per output: s >= 0 -> the output IS projection s; -1 -> the next
//                       output of the epilogue
//            epilogue = elementwise graph: inputs (projection 0..S-1 as [..., N], extras...),
//                       outputs = the node's outputs marked -1, in order
//            row_scale = the index of the last input, s [..., 1]: every projection is
//                       s[row] * (A @ W_s) before anything reads it (a folded RMSNorm's
//                       1/rms; FoldNormIntoGemm, src/passes/fold_norm.cc)
//            rms_epsilon = a last output [..., 1]: each row's 1/sqrt(mean(y^2) + epsilon) of
//                       output 0 (y), for the next GEMM's row_scale
//   (schemas::FusedGemmAttrs, src/ir/schemas/fused_gemm.h, reads and writes them.)
//
// Execution, in two phases of one launch:
//  1. the output columns are cut into blocks (and the rows too, when a block would not fit in
//     L2); a block runs S single-threaded GEMMs (one per projection: oneDNN on weights packed
//     once, else oneDNN's sgemm, as in gemm.cc). A projection that is a node
//     output is computed straight into that output; the others go to a workspace.
//  2. the epilogue program runs over whole rows of the output, a chunk of rows per claim,
//     reading the workspace back from L2 / L3 as long contiguous streams.
// Three epilogue forms need no phase 2 when the weights are packed: the store chain
// (StoreChain: residuals and biases the GEMM adds as it stores each block), the gated form
// (GatedEpilogue: SwiGLU's silu(gate) * up, applied block by block while the block is in L2)
// and the bias-activation form (BiasActEpilogue: U(p + bias), finished in place block by
// block); src/passes/gemm_epilogue_form.h recognizes them. They save phase 2's pass over the
// workspace.
// A general epilogue runs over whole rows rather than on each block right after its GEMM (row
// pieces of 64-512 columns), because the residual and the outputs come from L3 or memory,
// and the hardware prefetchers follow long rows but not short pieces with jumps between them
// (software prefetching of the next pieces recovered only part of it). The gated
// form differs: its per-block pass reads and writes only the block just computed, and the
// output is written by the GEMM's own stores; so does the bias-activation form's, on the
// output itself.
// Blocks and chunks are spread over the pool, one claim each.
// RunFusedGemm runs one function per form: RunGated, RunStoreChain and RunBiasAct for the
// packed forms, RunResidualAccumulate for a residual add without packed weights (sgemm
// accumulates onto a copy of it), and RunTwoPhase for the rest.
// The CPU kernels; the ops' shape rules and inference are in src/ir/schemas/fused_gemm.cc.
#include <algorithm>
#include <climits>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>

#include "cpu/elementwise_kernels.h"
#include "cpu/lower_group.h"
#include "cpu/simd.h"
#include "cpu/tile_program.h"
#include "ir/schemas/fused_gemm.h"
#include "cpu/kernels/kernel_lists.h"
#include "cpu/kernels/kernel_util.h"
#include "cpu/kernels/norm_rows.h"
#include "cpu/kernels/packed_gemm.h"
#include "cpu/kernels/sgemm.h"
#include "passes/gemm_epilogue_form.h"

namespace graphfuse::kernels {
namespace {

using gemm_epilogue::BiasActEpilogue;
using gemm_epilogue::BiasActForm;
using gemm_epilogue::GatedEpilogue;
using gemm_epilogue::PackedForm;
using gemm_epilogue::PackedFormOf;
using gemm_epilogue::ResidualInput;
using gemm_epilogue::StoreChain;
using schemas::FusedGemmAttrs;
using schemas::GemmGeometry;
using schemas::Geometry;

// Row-major strides over `space` of a [rows, ld]-laid-out matrix whose last dim is `space`'s
// last dim (leading dims flattened into rows).
cpu::TileDims MatrixStrides(const Shape& space, int64_t ld) {
  cpu::TileDims st;
  st.resize(space.size(), 0);
  int64_t stride = ld;
  st[space.size() - 1] = 1;
  for (size_t d = space.size() - 1; d-- > 0;) {
    st[d] = stride;
    stride *= space[d];
  }
  return st;
}

// Where projection s is written: the node output that IS it (leading dimension n), else the
// workspace (S*n).
std::vector<int64_t> ProjectionLd(const std::vector<int64_t>& out_proj, int64_t S, int64_t n) {
  std::vector<int64_t> ld(static_cast<size_t>(S), S * n);
  for (int64_t s : out_proj)
    if (s >= 0) ld[static_cast<size_t>(s)] = n;
  return ld;
}

// The weights of every projection, packed once (packed_gemm.h).
struct PackedProjections {
  int64_t m = 0;
  std::optional<StoreChain> chain;    // packed with the chain's adds as post-ops
  std::optional<GatedEpilogue> gate;  // packed for the gated form
  std::optional<BiasActEpilogue> bias_act;  // packed for the bias-activation form
  bool bias_in_gemm = false;  // its bias is the matmul's (added as the GEMM stores), U alone runs after
  std::vector<std::shared_ptr<const PackedGemm>> proj;
  // The epilogue of the last launch: its lowered program and the runner built for it, reused
  // while the data pointers hold (TileRunner::BoundTo), as the executor does for elementwise
  // steps, instead of lowering and planning it again on every launch.
  mutable std::mutex mu;
  mutable std::optional<cpu::TileProgram> program;
  mutable std::optional<cpu::TileRunner> runner;
};

Result<std::shared_ptr<const void>> PrepareFusedGemm(const Node& node, const PrepareOptions& options) {
  const Value* a = node.input(0);
  const Value* w = node.input(1);
  if (a->dtype() != DType::kF32 || w->dtype() != DType::kF32)
    return Unimplemented(node.Describe(), ": the CPU runs f32 GEMMs only, not ", a->TypeString(), " x ",
                         w->TypeString());
  if (!w->constant() || a->numel() == 0 || w->numel() == 0) return std::shared_ptr<const void>();
  const FusedGemmAttrs attrs = FusedGemmAttrs::Read(node);
  GF_ASSIGN_OR_RETURN(GemmGeometry g, Geometry(node.Describe(), a->shape(), w->shape(), attrs.splits));
  auto packed = std::make_shared<PackedProjections>();
  packed->m = g.m;
  PackedForm form = PackedFormOf(node, g);
  packed->gate = std::move(form.gate);
  packed->chain = std::move(form.chain);
  packed->bias_act = std::move(form.bias_act);
  packed->bias_in_gemm = packed->bias_act && packed->bias_act->bias_input >= 0;
  // The gated form keeps p_act alone in its workspace ([m, n]) and stores p_mul's product with
  // it in the output, and a store chain writes each projection into its output: all laid out
  // [m, n].
  std::vector<int64_t> ld = packed->gate || packed->chain ? std::vector<int64_t>(static_cast<size_t>(g.splits), g.n)
                                                          : ProjectionLd(attrs.out_proj, g.splits, g.n);
  auto pack = [&]() -> Status {
    packed->proj.clear();
    for (int64_t s = 0; s < g.splits; ++s) {
      using PostOp = PackedGemm::PostOp;
      std::vector<PostOp> ops;
      if (packed->gate && s == packed->gate->mul) ops.push_back({PostOp::Kind::kMul, false});
      if (packed->chain)
        for (const StoreChain::Link& l : packed->chain->links[static_cast<size_t>(s)])
          ops.push_back({PostOp::Kind::kAdd, l.row});
      if (packed->bias_in_gemm) ops.push_back({PostOp::Kind::kAdd, true});
      GF_ASSIGN_OR_RETURN(auto p, PackedGemm::Create(g.m, g.k, g.n, w->constant()->data_as<float>() + s * g.n,
                                                     g.splits * g.n, ld[static_cast<size_t>(s)], std::move(ops),
                                                     PackOptionsFor(options, *w->constant(),
                                                                    StrCat("columns from ", s * g.n, " of ", g.splits * g.n))));
      packed->proj.push_back(std::move(p));
    }
    return Status::Ok();
  };
  if (Status st = pack(); !st.ok()) {
    if (!packed->chain && !packed->gate && !packed->bias_in_gemm) return st;
    // Post-ops or a bias oneDNN would not build here (or only in its reference matmul): the
    // epilogue runs after the GEMMs, or per block.
    packed->chain.reset();
    packed->gate.reset();
    packed->bias_act = BiasActForm(node, g);
    packed->bias_in_gemm = false;
    ld = ProjectionLd(attrs.out_proj, g.splits, g.n);
    GF_RETURN_IF_ERROR(pack());
  }
  return std::shared_ptr<const void>(std::move(packed));
}

// Packed blocks per task: of 1..max_group, the one whose tasks, claimed in order by `threads`
// threads, finish soonest (columns as the cost), the largest among equals. Runs of the largest
// group can leave one thread a whole task behind: LLaMA-7B's gate/up (22 blocks of 512
// columns, 2 threads) made 5 tasks, 2560 + 2560 + 768 columns on one thread against 5504.
int64_t BalancedGroup(int64_t blocks, int64_t block_cols, int64_t n, int threads, int64_t max_group) {
  int64_t best = 1, best_span = INT64_MAX;
  for (int64_t g = 1; g <= max_group; ++g) {
    std::vector<int64_t> free_at(static_cast<size_t>(std::max(threads, 1)), 0);
    for (int64_t b = 0; b < blocks; b += g) {
      const int64_t cols = std::min(n, (b + g) * block_cols) - b * block_cols;
      *std::min_element(free_at.begin(), free_at.end()) += cols;
    }
    const int64_t span = *std::max_element(free_at.begin(), free_at.end());
    if (span <= best_span) best = g, best_span = span;
  }
  return best;
}

// x[0, n) = f(x) in place, with run(p, len) applying f to len floats at p (whole vectors): the
// whole vectors of x, then a ragged tail through a padded copy.
template <class Run>
void InPlaceWithPaddedTail(float* x, int64_t n, Run run) {
  const int64_t lanes = cpu::VectorLanes(), full = n / lanes * lanes;
  if (full > 0) run(x, full);
  if (full < n) {
    alignas(64) float tail[64] = {};
    std::copy(x + full, x + n, tail);
    run(tail, lanes);
    std::copy(tail, tail + (n - full), x + full);
  }
}

// x[0, n) = U(x) with U's tile kernel.
void ApplyUnaryInPlace(cpu::F32TileKernel kernel, const OpAttrs& attrs, float* x, int64_t n) {
  InPlaceWithPaddedTail(x, n, [&](float* p, int64_t len) {
    const float* in[1] = {p};
    kernel(in, p, len, attrs, 0);
  });
}

// x[0, n) = c * U(c * x) with U's scaled tile kernel.
void ApplyScaledUnaryInPlace(cpu::F32ScaledTileKernel kernel, const OpAttrs& attrs, float* x, int64_t n, float c) {
  InPlaceWithPaddedTail(x, n, [&](float* p, int64_t len) { kernel(p, p, len, attrs, 0, c); });
}

// x[0, n) += y[0, n), in f32 (an Add's bits).
void AddInPlace(float* x, const float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) x[j] += y[j];
}

// The rms_epsilon output's sums: a row's squares in double over chunks of columns
// (RowSumSquaresD each), the chunks then added in column order. A store chain sums each packed
// block's chunk in the block's task while it is in L2; otherwise a pass after the GEMMs sums
// chunks of kRmsChunk columns. Either way the chunks are fixed for a plan, so the bits do not
// depend on which thread ran which block.
constexpr int64_t kRmsChunk = 256;

// Each row's sums of squares of an [m, n] output, by chunks of `width` columns.
class RowSquareSums {
 public:
  RowSquareSums(int64_t m, int64_t n, int64_t width)
      : n_(n), width_(width), chunks_((n + width - 1) / width), ss_(static_cast<size_t>(m * chunks_)) {}
  int64_t chunks() const { return chunks_; }
  // Chunks [c0, c1) of row i, which starts at `row`.
  void Sum(const float* row, int64_t i, int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      ss_[static_cast<size_t>(i * chunks_ + c)] = RowSumSquaresD(row + c * width_, std::min(width_, n_ - c * width_));
  }
  // inv[i] = row i's 1/rms, as RMSNorm computes it (norm_rows.h).
  void InvRmsTo(float* inv, int64_t m, double eps) const {
    for (int64_t i = 0; i < m; ++i) {
      double ss = 0;
      for (int64_t c = 0; c < chunks_; ++c) ss += ss_[static_cast<size_t>(i * chunks_ + c)];
      inv[i] = InvRms(ss, n_, eps);
    }
  }

 private:
  int64_t n_, width_, chunks_;
  std::vector<double> ss_;
};

// One launch of a FusedGemm node: what every epilogue form shares. The output is cut into
// blocks for the GEMMs, claimed one per task, and into chunks of whole rows for the passes over
// it (the epilogue, the residual's copy).
struct Launch {
  Launch(const KernelContext& ctx, const FusedGemmAttrs& attrs, const GemmGeometry& g, const PackedProjections* packed)
      : ctx(ctx), attrs(attrs), g(g), packed(packed), a(ctx.inputs[0].as<const float>()),
        w(ctx.inputs[1].as<const float>()) {
    const int64_t m = g.m, n = g.n, k = g.k, S = g.splits;
    // Blocks: each sgemm call packs its rows of A again, so blocks are as wide as the threads
    // allow (one per thread: N / threads columns) while a block of all S projections stays
    // within ~2 MiB (L2); never narrower than 256 columns (for large M the A repacking would
    // cost more than the cache saves); rows are cut only when even that does not fit.
    constexpr int64_t kBlockBytes = 2 << 20;
    constexpr int64_t kEpilogueChunk = 16384;
    const int64_t work = m * n * S * std::max<int64_t>(k, 1) / 8;
    threads = ctx.cpu.pool ? ctx.cpu.ThreadsFor(work) : 1;
    const int64_t nb_threads = (n + threads - 1) / threads;
    const int64_t nb_fit = kBlockBytes / (m * S * 4) / 16 * 16;
    // Packed weights come in fixed column blocks of all rows; a task takes a run of `group` of
    // them (at least two tasks per thread, within the L2 budget), balanced over the threads.
    pb = packed ? packed->proj[0]->block_cols() : 0;
    pblocks = packed ? packed->proj[0]->blocks() : 0;
    group = packed ? BalancedGroup(pblocks, pb, n, threads,
                                   std::clamp<int64_t>(std::min<int64_t>(pblocks / (2 * threads),
                                                                         kBlockBytes / (m * pb * S * 4)),
                                                       1, pblocks))
                   : 1;
    nb = packed ? pb * group : std::min({n, nb_threads, std::max<int64_t>(256, nb_fit)});
    mb = packed ? m : std::clamp<int64_t>(2 * kBlockBytes / (nb * S * 4), 1, m);
    col_blocks = (n + nb - 1) / nb;
    row_blocks = (m + mb - 1) / mb;
    blocks = col_blocks * row_blocks;
    nthreads = static_cast<int>(std::min<int64_t>(threads, blocks));
    // Chunks: whole rows, about kEpilogueChunk elements, at least two per thread when M allows.
    chunk_rows = std::clamp<int64_t>(kEpilogueChunk / n, 1, std::max<int64_t>(1, m / (2 * threads)));
    chunks = (m + chunk_rows - 1) / chunk_rows;
    chunk_threads = static_cast<int>(std::min<int64_t>(threads, chunks));
  }

  // Runs f(b) for every block b, one claim each, as one task of the profile's split.
  template <class F>
  void ForEachBlock(F&& f) const {
    ForEachClaimed(ctx.cpu, nthreads, blocks, [&](int64_t b, int) {
      const ScopedNs task_time(TaskCounter(ctx.cpu));
      f(b);
    });
  }
  // The packed blocks of column block cb: [FirstPacked(cb), EndPacked(cb)).
  int64_t FirstPacked(int64_t cb) const { return cb * group; }
  int64_t EndPacked(int64_t cb) const { return std::min(pblocks, (cb + 1) * group); }
  // bf16 weights past the streaming rows: A converted once for every block (the projections
  // share A and the weights' storage); else null.
  const uint16_t* ConvertedA() const {
    thread_local std::vector<uint16_t> a16_buf;
    return packed && !packed->proj.empty() ? packed->proj[0]->ConvertA(a, a16_buf) : nullptr;
  }
  // A folded RMSNorm's scale of each row (the row_scale input), or null.
  const float* RowScale() const {
    return attrs.row_scale >= 0 ? ctx.inputs[static_cast<size_t>(attrs.row_scale)].as<const float>() : nullptr;
  }

  const KernelContext& ctx;
  const FusedGemmAttrs& attrs;
  const GemmGeometry& g;
  const PackedProjections* packed;  // null: sgemm on the weights as they are
  const float* a;
  const float* w;
  int threads = 1;
  int64_t pb = 0, pblocks = 0, group = 1;  // packed: block width, blocks, blocks per task
  int64_t nb = 0, mb = 0, col_blocks = 0, row_blocks = 0, blocks = 0;  // blocks of nb columns by mb rows
  int nthreads = 1;
  int64_t chunk_rows = 0, chunks = 0;
  int chunk_threads = 1;
};

// `bytes` from the pool's scratch of task 0, taken before the launch (tasks must not call
// Scratch themselves), else from `local`.
char* TakeScratch(const CpuContext& cpu, size_t bytes, std::unique_ptr<char[]>& local) {
  if (cpu.pool) return static_cast<char*>(cpu.pool->Scratch(0, bytes));
  local = std::make_unique_for_overwrite<char[]>(bytes + 64);
  return local.get();
}

// The rms_epsilon output, once output 0 is final: each row's 1/rms of it into the last output.
// `summed` holds the rows' sums when a store chain took them per block; else a pass over
// output 0 sums them.
void WriteInvRms(const Launch& l, const RowSquareSums* summed) {
  const int64_t m = l.g.m, n = l.g.n;
  std::optional<RowSquareSums> pass;
  if (!summed) {
    RowSquareSums& sums = pass.emplace(m, n, kRmsChunk);
    const float* y = l.ctx.outputs[0].as<const float>();
    ForEachClaimed(l.ctx.cpu, std::min<int>(l.threads, static_cast<int>(std::min<int64_t>(m, INT_MAX))), m,
                   [&](int64_t i, int) {
                     const ScopedNs task_time(TaskCounter(l.ctx.cpu));
                     sums.Sum(y + i * n, i, 0, sums.chunks());
                   });
    summed = &sums;
  }
  summed->InvRmsTo(l.ctx.outputs.back().as<float>(), m, *l.attrs.rms_epsilon);
}

// The gated form (GatedEpilogue, packed only): per block, p_act's GEMM into a workspace
// ([m, n]), U in place while the block is in L2 (with a row scale s: s * U(s * p_act)), then
// p_mul's GEMM multiplying by it as it stores into the output. No epilogue pass follows.
Status RunGated(const Launch& l, const GatedEpilogue& gate) {
  const KernelContext& ctx = l.ctx;
  const int64_t m = l.g.m, n = l.g.n;
  const PackedProjections& packed = *l.packed;
  float* out = ctx.outputs[0].as<float>();
  std::unique_ptr<char[]> local;
  float* act = reinterpret_cast<float*>(TakeScratch(ctx.cpu, static_cast<size_t>(m * n) * sizeof(float), local));
  const float* rs = l.RowScale();
  const cpu::F32TileKernel kernel = cpu::GetF32TileKernel(gate.u.kind);
  const cpu::F32ScaledTileKernel scaled_kernel = cpu::GetF32ScaledTileKernel(gate.u.kind);
  const uint16_t* a16 = l.ConvertedA();
  l.ForEachBlock([&](int64_t b) {
    const int64_t cb = b % l.col_blocks;
    for (int64_t q = l.FirstPacked(cb); q < l.EndPacked(cb); ++q) {
      {
        const ScopedNs blas_time(BlasCounter(ctx.cpu));
        packed.proj[gate.act]->RunBlock(q, l.a, act, {}, a16);
      }
      const int64_t c0 = q * l.pb, width = std::min(l.pb, n - c0);
      for (int64_t i = 0; i < m; ++i) {
        float* x = act + i * n + c0;
        if (rs) ApplyScaledUnaryInPlace(scaled_kernel, gate.u.attrs, x, width, rs[i]);  // s * U(s * x)
        else ApplyUnaryInPlace(kernel, gate.u.attrs, x, width);
      }
      const ScopedNs blas_time(BlasCounter(ctx.cpu));
      const float* const mul[] = {act};
      packed.proj[gate.mul]->RunBlock(q, l.a, out, mul, a16);
    }
  });
  if (l.attrs.rms_epsilon) WriteInvRms(l, nullptr);
  return Status::Ok();
}

// The store-chain form (StoreChain, packed only): the GEMM adds the chain's inputs as it stores
// each block, straight into the outputs; no epilogue runs. Output 0's row sums for rms_epsilon
// are taken per block while it is in L2. (PackedFormOf forms no chain with a row scale.)
Status RunStoreChain(const Launch& l, const StoreChain& chain) {
  const KernelContext& ctx = l.ctx;
  const int64_t m = l.g.m, n = l.g.n, S = l.g.splits;
  std::vector<float*> out(static_cast<size_t>(S));
  std::vector<std::vector<const float*>> operands(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) {
    out[static_cast<size_t>(s)] = ctx.outputs[static_cast<size_t>(chain.output[static_cast<size_t>(s)])].as<float>();
    for (const StoreChain::Link& link : chain.links[static_cast<size_t>(s)])
      operands[static_cast<size_t>(s)].push_back(ctx.inputs[static_cast<size_t>(link.input)].as<const float>());
  }
  std::optional<RowSquareSums> sums;
  if (l.attrs.rms_epsilon) sums.emplace(m, n, l.pb);
  const uint16_t* a16 = l.ConvertedA();
  l.ForEachBlock([&](int64_t b) {
    const int64_t cb = b % l.col_blocks;
    for (int64_t s = 0; s < S; ++s) {
      float* y = out[static_cast<size_t>(s)];
      for (int64_t q = l.FirstPacked(cb); q < l.EndPacked(cb); ++q) {
        {
          const ScopedNs blas_time(BlasCounter(ctx.cpu));
          l.packed->proj[s]->RunBlock(q, l.a, y, operands[static_cast<size_t>(s)], a16);
        }
        // Output 0, final once stored: its row sums while the block is in L2.
        if (sums && chain.output[static_cast<size_t>(s)] == 0)
          for (int64_t i = 0; i < m; ++i) sums->Sum(y + i * n, i, q, q + 1);
      }
    }
  });
  if (sums) WriteInvRms(l, &*sums);
  return Status::Ok();
}

// The bias-activation form (BiasActEpilogue, packed only): the GEMM writes the output (adding
// the bias as it stores where it is the matmul's), and each block is finished in place right
// after its GEMM: the bias where the GEMM did not add it, then U. No epilogue pass follows.
Status RunBiasAct(const Launch& l, const BiasActEpilogue& form) {
  const KernelContext& ctx = l.ctx;
  const int64_t m = l.g.m, n = l.g.n;
  const bool bias_in_gemm = l.packed->bias_in_gemm;
  float* out = ctx.outputs[0].as<float>();
  const cpu::F32TileKernel act_kernel = form.u ? cpu::GetF32TileKernel(form.u->kind) : nullptr;
  const float* bias =
      form.bias_input >= 0 ? ctx.inputs[static_cast<size_t>(form.bias_input)].as<const float>() : nullptr;
  const uint16_t* a16 = l.ConvertedA();
  l.ForEachBlock([&](int64_t b) {
    const int64_t cb = b % l.col_blocks;
    for (int64_t q = l.FirstPacked(cb); q < l.EndPacked(cb); ++q) {
      {
        const ScopedNs blas_time(BlasCounter(ctx.cpu));
        const float* const gemm_bias[] = {bias};
        l.packed->proj[0]->RunBlock(q, l.a, out, std::span<const float* const>(gemm_bias, bias_in_gemm ? 1 : 0), a16);
      }
      const int64_t c0 = q * l.pb, width = std::min(l.pb, n - c0);
      for (int64_t i = 0; i < m; ++i) {
        float* row = out + i * n + c0;
        if (bias && !bias_in_gemm) AddInPlace(row, bias + c0, width);
        if (act_kernel) ApplyUnaryInPlace(act_kernel, form.u->attrs, row, width);
      }
    }
  });
  if (l.attrs.rms_epsilon) WriteInvRms(l, nullptr);
  return Status::Ok();
}

// The residual form without packed weights (ResidualInput: one projection plus r): the output
// takes a copy of r over chunks of whole rows, then sgemm accumulates onto it (beta = 1); no
// epilogue runs.
Status RunResidualAccumulate(const Launch& l, int64_t residual) {
  const KernelContext& ctx = l.ctx;
  const int64_t m = l.g.m, n = l.g.n, k = l.g.k;
  const float* r = ctx.inputs[static_cast<size_t>(residual)].as<const float>();
  float* out = ctx.outputs[0].as<float>();
  ForEachClaimed(ctx.cpu, l.chunk_threads, l.chunks, [&](int64_t c, int) {
    const ScopedNs task_time(TaskCounter(ctx.cpu));
    const int64_t begin = c * l.chunk_rows * n, end = std::min(m, (c + 1) * l.chunk_rows) * n;
    if (out != r) std::copy(r + begin, r + end, out + begin);  // an output in place of r has it already
  });
  l.ForEachBlock([&](int64_t b) {
    const int64_t cb = b % l.col_blocks, rb = b / l.col_blocks;
    const int64_t j0 = cb * l.nb, j1 = std::min(n, j0 + l.nb), i0 = rb * l.mb, i1 = std::min(m, i0 + l.mb);
    const ScopedNs blas_time(BlasCounter(ctx.cpu));
    if (k == 0) return;  // r is the output
    // One projection: the weights' and the output's rows are n long.
    Sgemm(false, false, i1 - i0, j1 - j0, k, 1.f, l.a + i0 * k, k, l.w + j0, n, 1.f, out + i0 * n + j0, n);
  });
  if (l.attrs.rms_epsilon) WriteInvRms(l, nullptr);
  return Status::Ok();
}

// The general form, in two phases: the GEMMs write each projection into the output that IS it,
// else into a workspace ([m, S*n]), block by block (times its row's scale with a row_scale);
// then the epilogue program runs over chunks of whole rows. Also the GEMMs without an epilogue,
// and the packed forms where oneDNN would not pack their post-ops (PrepareFusedGemm).
Status RunTwoPhase(const Launch& l) {
  const KernelContext& ctx = l.ctx;
  const std::vector<int64_t>& out_proj = l.attrs.out_proj;
  const Graph* epi = l.attrs.epilogue.get();
  const int64_t m = l.g.m, n = l.g.n, k = l.g.k, S = l.g.splits, ldw = S * n;
  const float* rs = l.RowScale();

  // Where each projection lives: a node output (ld = n) or the workspace (ld = S*n).
  std::vector<float*> proj(S, nullptr);
  const std::vector<int64_t> proj_ld = ProjectionLd(out_proj, S, n);
  for (size_t o = 0; o < out_proj.size(); ++o)
    if (out_proj[o] >= 0 && !proj[out_proj[o]]) proj[out_proj[o]] = ctx.outputs[o].as<float>();
  bool need_ws = false;
  for (int64_t s = 0; s < S; ++s) need_ws |= proj[s] == nullptr;

  // The epilogue, prepared once for this launch over the whole output space.
  std::optional<cpu::TileRunner> runner;
  size_t reg_bytes = 0;
  const size_t ws_bytes = need_ws ? static_cast<size_t>(m * ldw) * sizeof(float) : 0;
  // One allocation: the workspace, then one register area per thread.
  char* scratch = nullptr;
  std::unique_ptr<char[]> local;
  if (epi) {
    std::optional<cpu::TileProgram> cached_program;
    std::optional<cpu::TileRunner> cached_runner;
    if (l.packed) {
      const std::lock_guard<std::mutex> lock(l.packed->mu);
      cached_program = l.packed->program;
      cached_runner = l.packed->runner;
    }
    if (!cached_program) {  // (then no runner either: the two are stored together)
      GF_ASSIGN_OR_RETURN(cached_program, cpu::LowerElementwiseGroup(*epi));
    }
    cpu::TileProgram& p = *cached_program;
    // The register size: the cached runner's, else a probe's (data pointers unbound).
    reg_bytes = ((cached_runner ? cached_runner->scratch_bytes() : cpu::TileRunner(p).scratch_bytes()) + 63) / 64 * 64;
    scratch = TakeScratch(ctx.cpu, ws_bytes + reg_bytes * static_cast<size_t>(l.threads) + 64, local);
    float* ws = reinterpret_cast<float*>(scratch);
    for (int64_t s = 0; s < S; ++s)
      if (!proj[s]) proj[s] = ws + s * n;
    for (int64_t s = 0; s < S; ++s) {
      p.inputs[s].data = proj[s];
      p.inputs[s].strides = MatrixStrides(l.g.out_shape, proj_ld[s]);
    }
    for (size_t e = 0; e + S < p.inputs.size(); ++e) p.inputs[S + e].data = ctx.inputs[2 + e].data;
    size_t next = 0;
    for (size_t o = 0; o < out_proj.size(); ++o)
      if (out_proj[o] < 0) p.outputs[next++].data = ctx.outputs[o].data;
    if (cached_runner && cached_runner->BoundTo(p, ctx.cpu.codegen)) {
      runner = std::move(cached_runner);
    } else {
      runner.emplace(p, ctx.cpu.codegen);
      if (l.packed) {
        const std::lock_guard<std::mutex> lock(l.packed->mu);
        l.packed->program = p;
        l.packed->runner = runner;
      }
    }
  } else if (need_ws) {
    return Internal(KernelWhere(ctx), ": a projection is neither an output nor read by an epilogue");
  }

  // Phase 1: the GEMMs, packed blocks of all rows, else sgemm on blocks of rows and columns.
  const uint16_t* a16 = l.ConvertedA();
  l.ForEachBlock([&](int64_t b) {
    const int64_t cb = b % l.col_blocks, rb = b / l.col_blocks;
    const int64_t j0 = cb * l.nb, j1 = std::min(n, j0 + l.nb), i0 = rb * l.mb, i1 = std::min(m, i0 + l.mb);
    for (int64_t s = 0; s < S; ++s) {
      if (l.packed) {
        for (int64_t q = l.FirstPacked(cb); q < l.EndPacked(cb); ++q) {
          {
            const ScopedNs blas_time(BlasCounter(ctx.cpu));
            l.packed->proj[s]->RunBlock(q, l.a, proj[s], {}, a16);
          }
          const int64_t c0 = q * l.pb, width = std::min(l.pb, n - c0);
          if (rs)
            for (int64_t i = 0; i < m; ++i) simd::ScaleRow(proj[s] + i * proj_ld[s] + c0, width, rs[i]);
        }
        continue;
      }
      const ScopedNs blas_time(BlasCounter(ctx.cpu));
      if (k == 0) {
        for (int64_t i = i0; i < i1; ++i) std::fill(proj[s] + i * proj_ld[s] + j0, proj[s] + i * proj_ld[s] + j1, 0.f);
        continue;
      }
      Sgemm(false, false, i1 - i0, j1 - j0, k, 1.f, l.a + i0 * k, k, l.w + s * n + j0, ldw, 0.f,
            proj[s] + i0 * proj_ld[s] + j0, proj_ld[s]);
      if (rs)
        for (int64_t i = i0; i < i1; ++i) simd::ScaleRow(proj[s] + i * proj_ld[s] + j0, j1 - j0, rs[i]);
    }
  });
  // Phase 2: the epilogue over chunks of whole rows. Not TileRunner::Launch nor fused_rowwise's
  // ForRowBlocks: both take each thread's registers from pool->Scratch(tid), and thread 0's
  // scratch holds the workspace; and each chunk counts as a task for the profile's split.
  if (runner) {
    char* regs_base = scratch + ws_bytes + (64 - reinterpret_cast<uintptr_t>(scratch + ws_bytes) % 64) % 64;
    ForEachClaimed(ctx.cpu, l.chunk_threads, l.chunks, [&](int64_t c, int tid) {
      const ScopedNs task_time(TaskCounter(ctx.cpu));
      runner->Run(c * l.chunk_rows * n, std::min(m, (c + 1) * l.chunk_rows) * n,
                  regs_base + reg_bytes * static_cast<size_t>(tid));
    });
  }
  if (l.attrs.rms_epsilon) WriteInvRms(l, nullptr);
  return Status::Ok();
}

// Runs the epilogue form that PrepareFusedGemm packed for (PackedFormOf), else the residual
// form of unpacked weights, else the general two-phase form.
Status RunFusedGemm(const KernelContext& ctx) {
  const FusedGemmAttrs attrs = FusedGemmAttrs::Read(ctx.node);
  GF_ASSIGN_OR_RETURN(GemmGeometry g,
                      Geometry(KernelWhere(ctx), ctx.inputs[0].shape, ctx.inputs[1].shape, attrs.splits));
  if (g.m * g.n == 0) {  // an empty row's 1/rms is NaN, as RMSNorm's (0 / 0 mean)
    if (attrs.rms_epsilon)
      std::fill_n(ctx.outputs.back().as<float>(), g.m, std::numeric_limits<float>::quiet_NaN());
    return Status::Ok();
  }
  const auto* packed = static_cast<const PackedProjections*>(ctx.state);
  if (packed && (packed->m != g.m || static_cast<int64_t>(packed->proj.size()) != g.splits)) packed = nullptr;
  const Launch launch(ctx, attrs, g, packed);
  if (packed && packed->gate) return RunGated(launch, *packed->gate);
  if (packed && packed->chain) return RunStoreChain(launch, *packed->chain);
  if (packed && packed->bias_act) return RunBiasAct(launch, *packed->bias_act);
  if (const int64_t residual = packed ? -1 : ResidualInput(ctx.node, g); residual >= 0)
    return RunResidualAccumulate(launch, residual);
  return RunTwoPhase(launch);
}

std::string DescribeFusedGemm(const Node& node, const PrepareOptions& options) {
  const Value* a = node.input(0);
  const Value* w = node.input(1);
  if (a->dtype() != DType::kF32 || w->dtype() != DType::kF32) return "";
  auto g = Geometry(node.Describe(), a->shape(), w->shape(), FusedGemmAttrs::Read(node).splits);
  if (!g.ok()) return g.status().message();
  const std::string each = g->splits > 1 ? StrCat(g->splits, " projections, each ") : "";
  if (!w->constant()) return StrCat(each, kActivationGemms, " (the weights are not a constant)");
  return each + DescribePackedGemm(g->m, g->k, g->n, options);
}

}  // namespace

std::vector<CpuKernel> FusedGemmKernels() {
  return {{"FusedGemm", RunFusedGemm, PrepareFusedGemm, DescribeFusedGemm}};
}

}  // namespace graphfuse::kernels
