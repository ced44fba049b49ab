// FusedAttention as ONE flash-style kernel for many query rows per head (prefill): the S x Sk
// scores never go to memory.
//
// A thread block (kCudaBlockSize = 256 threads) owns a tile of kBr query rows of one (batch,
// head) and grid-strides over (batch, head, query tile). kTpr = 256 / kBr threads serve a row.
//   1. The tile's query rows (roped) go to shared memory, coalesced (a row's columns side by
//      side).
//   2. For each tile of kBc keys: K (roped; read along its rows, or along the keys for K^T) and
//      V are staged in shared memory, coalesced. Each thread forms the scores of its row for
//      keys lane, lane + kTpr, ... (scale * q.k, then the masks as the other forms apply them),
//      the row's max over the tile from the row's partials in a fixed order, then the online
//      softmax: m' = max(m, tile max), alpha = exp(m - m'), p = exp(s - m') into shared memory,
//      l = l * alpha + sum p (in double), the accumulator scaled by alpha and p V added. A
//      thread accumulates columns lane, lane + kTpr, ... of its row's output in registers.
//   3. out = acc * (1 / l), rounded once to the output's dtype.
// A row with no finite score so far subtracts 0 instead of -inf (its exponentials are then 0,
// not NaN); a row whose every score is -inf ends with l = 0 and is NaN, as on the CPU, or 0
// under zero_nan_rows (the softmax's NaN guard absorbed).
//
// Causal tiles: when the node's mask (an f32 mask alone, or a bool mask alone) is a constant
// that drops every key from r + 1 + kOff on from row r (at most; mask_scale * mask <= -1e4, or
// the bool mask's fill <= -1e4), the key tiles past the query tile's last live key are not
// computed, provided that leaving them out changes nothing, as src/cpu/kernels/attention_mask.h
// leaves such keys out: the tile's V is finite (a zero weight times inf is NaN), and for every
// row the largest value a dropped key can hold (|scale| * sum_c |q_c| * max_k |k_kc|, 1% over,
// plus the largest mask value there; a bool mask: its fill) lies 1000 below the row's running
// max, so its exponential is exactly 0 and the max does not move. Otherwise the tile is computed
// as any other. (K and V of such a tile are still loaded for the test; its products are skipped.)
//
// Shared memory: q [kBr][d+1], k [kBc][d+1], v [kBc][dv], p [kBr][kBc+1] floats and the row
// partials; kBr = 32 (16 for heads wider than 128), kBc the widest of 64 / 32 / 16 that keeps it
// under 40 KiB (static shared memory is capped at 48 KiB).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "cuda/codegen_attention.h"
#include "cuda/codegen_internal.h"
#include "cuda/device_prelude.h"

namespace graphfuse::cuda {
namespace {

using namespace internal;

constexpr int64_t kMaxFlashHeadDim = 256;
constexpr int64_t kFlashSmemBytes = 40 * 1024;
constexpr float kSkippableMask = -1e4f;  // as MaskRows::kSkippable (src/cpu/kernels/attention_mask.h)

struct FlashTiles {
  int64_t br = 0, bc = 0, tpr = 0, acc = 0;
};

Result<FlashTiles> ChooseTiles(const schemas::Dims& d, const std::string& where) {
  if (d.d > kMaxFlashHeadDim || d.dv > kMaxFlashHeadDim)
    return Unimplemented(where, ": head_dim ", d.d, " / ", d.dv, " exceeds the flash kernel's ", kMaxFlashHeadDim);
  FlashTiles t;
  t.br = d.d > 128 || d.dv > 128 ? 16 : 32;
  t.tpr = kCudaBlockSize / t.br;
  t.acc = std::max<int64_t>(1, (d.dv + t.tpr - 1) / t.tpr);
  for (int64_t bc : {64, 32, 16}) {
    const int64_t floats = t.br * (d.d + 1) + bc * (d.d + 1) + bc * d.dv + t.br * (bc + 1) + t.br * t.tpr + d.d;
    const int64_t bytes = floats * 4 + t.br * t.tpr * 8;
    if (bytes <= kFlashSmemBytes && bc % t.tpr == 0) {
      t.bc = bc;
      return t;
    }
  }
  return Unimplemented(where, ": head_dim ", d.d, " / ", d.dv, " does not fit the flash kernel's shared memory");
}

// The causal structure of a constant mask: every row r drops keys from r + 1 + off on (its
// values there are at most `bound`, after mask_scale; a bool mask: the fill).
struct CausalTail {
  int64_t off = 0;
  double bound = -std::numeric_limits<double>::infinity();
  bool bool_mask = false;
};

// The node's constant mask as a CausalTail, when it drops the last keys of some row.
std::optional<CausalTail> ReadCausalTail(const Node& node, const AttentionParts& a) {
  const schemas::Dims& d = a.d;
  if (d.mask == (d.mask_select != 0)) return std::nullopt;  // no mask, or both
  const Value* mv = node.input(static_cast<size_t>(d.mask ? d.first_extra() : d.bool_mask_index()));
  if (!mv || !mv->constant()) return std::nullopt;
  const Tensor& m = *mv->constant();
  const std::vector<int64_t>& st = d.mask ? a.ms : a.bms;
  if (d.mask ? !IsFloat(m.dtype()) : (m.dtype() != DType::kBool || !(d.mask_fill <= kSkippableMask)))
    return std::nullopt;
  const int64_t nb = st[0] ? d.b : 1, nh = st[1] ? d.h : 1;
  if (nb * nh * d.s * d.sk > (int64_t{1} << 26)) return std::nullopt;
  CausalTail c;
  c.bool_mask = !d.mask;
  // value(b, h, r, j) after mask_scale, rounded as the kernel rounds it; dropped(..) says the
  // key may be left out of row r.
  auto value = [&](int64_t off) {
    const float x = static_cast<float>(m.GetAsDouble(off));  // f32, or f16 / bf16 widened exactly
    return a.mask_scale == 1.f ? x : x * a.mask_scale;
  };
  auto dropped = [&](int64_t off) {
    if (c.bool_mask) return (static_cast<const uint8_t*>(m.data())[off] != 0) != (d.mask_select > 0);
    return value(off) <= kSkippableMask;  // NaN stays
  };
  int64_t off = std::numeric_limits<int64_t>::min();
  bool drops = false;
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t r = 0; r < d.s; ++r) {
        const int64_t base = b * st[0] + h * st[1] + r * st[2];
        int64_t live = d.sk;
        while (live > 0 && dropped(base + (live - 1) * st[3])) --live;
        off = std::max(off, live - r - 1);
        drops = drops || live < d.sk;
      }
  c.off = off;
  // Whether query tiles may leave key tiles out is the kernel's test at run time (the keys from
  // kend on): a mask that drops a row's last keys takes the test at every length, so that the
  // lengths of one class share one source.
  if (!drops) return std::nullopt;
  if (c.bool_mask) {
    c.bound = d.mask_fill;
    return c;
  }
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t r = 0; r < d.s; ++r)
        for (int64_t j = std::clamp<int64_t>(r + 1 + off, 0, d.sk); j < d.sk; ++j)
          c.bound = std::max(c.bound, static_cast<double>(value(b * st[0] + h * st[1] + r * st[2] + j * st[3])));
  return c;
}

}  // namespace

Result<CudaKernelSource> GenerateFlashAttentionKernel(const Node& node) {
  const std::string where = StrCat("CUDA codegen: ", node.Describe(), " (flash attention)");
  GF_ASSIGN_OR_RETURN(AttentionParts a, ReadAttention(node, where));
  const schemas::Dims& d = a.d;
  if (d.b * d.h * d.s * d.dv == 0 || d.sk == 0 || d.d == 0)
    return Unimplemented(where, ": an empty problem (", d.s, " rows, ", d.sk, " keys, head_dim ", d.d, ")");
  GF_ASSIGN_OR_RETURN(FlashTiles tl, ChooseTiles(d, where));
  const std::optional<CausalTail> causal = ReadCausalTail(node, a);
  const schemas::HeadAccess &qa = a.qa, &ka = a.ka, &va = a.va, &oa = a.oa;
  const int64_t qtiles = (d.s + tl.br - 1) / tl.br;

  CudaKernelSource k;
  k.num_elements = d.b * d.h * d.s * d.dv;
  k.row_kernel = true;
  k.scalar_work_items = d.b * d.h * qtiles;  // one block per query tile
  for (const Value* v : node.inputs()) k.input_dtypes.push_back(v->dtype());
  k.output_dtypes = {a.out_dt};

  std::string head = kDevicePrelude;
  head += "\n}  // namespace gf\n\n";
  head += StrCat("extern \"C\" __global__ void __launch_bounds__(", kCudaBlockSize, ") ");
  KernelSizes z;
  std::string t = HeadDims(a, z);
  t += StrCat("  constexpr int kBr = ", tl.br, ", kBc = ", tl.bc, ", kTpr = ", tl.tpr, ", kAcc = ", tl.acc, ";\n");
  t += "  __shared__ float qs[kBr * (kD + 1)];\n  __shared__ float ks[kBc * (kD + 1)];\n";
  t += "  __shared__ float vs[kBc * kDv];\n  __shared__ float ps[kBr * (kBc + 1)];\n";
  t += "  __shared__ float pmax[kBr * kTpr];\n  __shared__ double psum[kBr * kTpr];\n";
  if (causal) t += "  __shared__ float kmax[kD];\n  __shared__ int skip;\n";
  t += "  const int tid = threadIdx.x, i = tid / kTpr, lane = tid % kTpr;\n";
  t += "  const float kNegInf = -__int_as_float(0x7f800000);\n";
  t += StrCat("  for (long long item = blockIdx.x; item < ", z.Use("kItems", d.b * d.h * qtiles), "; item += gridDim.x) {\n");
  const std::string qt = z.Use("kQtiles", qtiles);
  t += StrCat("    const long long qt = item % ", qt, ", bh = item / ", qt, ", h = bh % kH, b = bh / kH;\n");
  t += "    const long long r0 = qt * kBr, r = r0 + i;\n    const bool rv = r < kS;\n";
  t += StrCat("    const ", StorageType(a.q_dt), "* qh = q + ", HeadRow(z, "q", qa, "h", ""), ";\n");
  t += StrCat("    const ", StorageType(a.k_dt), "* kh = k + ", HeadRow(z, "k", ka, a.kvh, ""), ";\n");
  t += StrCat("    const ", StorageType(a.v_dt), "* vh = v + ", HeadRow(z, "v", va, a.kvh, ""), ";\n");
  t += StrCat("    ", StorageType(a.out_dt), "* oh = out + ", HeadRow(z, "o", oa, "h", ""), ";\n");
  // 1. The query tile.
  t += "    __syncthreads();  // the previous tile's readers are done with the shared arrays\n";
  t += StrCat("    for (int e = tid; e < kBr * kD; e += ", kCudaBlockSize, ") {\n");
  t += "      const long long rq = r0 + e / kD, c = e % kD;\n      float x = 0.f;\n      if (rq < kS) {\n";
  const std::string q_sr = z.Use("q_sr", qa.row_stride), k_sr = z.Use("k_sr", ka.row_stride);
  auto read_q = [&](const std::string& col) { return LoadF32(a.q_dt, StrCat("qh[rq * ", q_sr, " + ", col, "]")); };
  if (d.rope_q) {
    t += RopedStore(a.cos_dt, a.sin_dt, read_q, a.cq, "rq", "x", "        ", z, "cq");
  } else {
    t += StrCat("        x = ", read_q("c"), ";\n");
  }
  t += "      }\n      qs[(e / kD) * (kD + 1) + c] = x;\n    }\n";
  t += "    float m = kNegInf, acc[kAcc];\n    double l = 0;\n";
  t += "    for (int u = 0; u < kAcc; ++u) acc[u] = 0.f;\n";
  if (causal) {
    t += StrCat("    const long long rlast = (r0 + kBr < kS ? r0 + kBr : kS) - 1, live = rlast + 1 + ", z.Use("kOff", causal->off),
                ";\n");
    t += "    const long long kend = live < 0 ? 0 : live > kSk ? kSk : live;  // keys from kend on: dropped by every row\n";
  }
  // 2. Key tiles.
  t += "    for (long long j0 = 0; j0 < kSk; j0 += kBc) {\n";
  t += "      __syncthreads();  // the previous key tile's readers are done with ks, vs, ps\n";
  t += StrCat("      for (int e = tid; e < kBc * kD; e += ", kCudaBlockSize, ") {\n");
  if (a.kt) {  // K^T [d, Sk]: consecutive threads read consecutive keys
    t += "        const int jj = e % kBc;\n        const long long c = e / kBc, j = j0 + jj;\n";
  } else {
    t += "        const int jj = e / kD;\n        const long long c = e % kD, j = j0 + jj;\n";
  }
  t += "        float x = 0.f;\n        if (j < kSk) {\n";
  auto read_k = [&](const std::string& col) {
    return LoadF32(a.k_dt, a.kt ? StrCat("kh[(", col, ") * ", k_sr, " + j]") : StrCat("kh[j * ", k_sr, " + ", col, "]"));
  };
  if (d.rope_k) {
    t += RopedStore(a.cos_dt, a.sin_dt, read_k, a.ck, "j", "x", "          ", z, "ck", a.kvh);
  } else {
    t += StrCat("          x = ", read_k("c"), ";\n");
  }
  t += "        }\n        ks[jj * (kD + 1) + c] = x;\n      }\n";
  t += StrCat("      for (int e = tid; e < kBc * kDv; e += ", kCudaBlockSize, ") {\n");
  t += "        const long long j = j0 + e / kDv, c = e % kDv;\n";
  t += StrCat("        vs[e] = j < kSk ? ", LoadF32(a.v_dt, StrCat("vh[j * ", z.Use("v_sr", va.row_stride), " + c]")),
              " : 0.f;\n      }\n");
  if (causal) t += "      if (tid == 0) skip = 1;\n";
  t += "      __syncthreads();\n";
  if (causal) {
    // The test that leaves the tile out (see the top of this file).
    t += "      if (j0 >= kend) {\n";
    t += "        const int valid = kSk - j0 < kBc ? static_cast<int>(kSk - j0) : kBc;\n";
    t += StrCat("        for (int e = tid; e < valid * kDv; e += ", kCudaBlockSize, ")\n");
    t += "          if (!(vs[e] * 0.f == 0.f)) skip = 0;  // inf or NaN\n";
    if (!causal->bool_mask) {
      t += StrCat("        for (int c = tid; c < kD; c += ", kCudaBlockSize, ") {\n");
      t += "          float km = 0.f;\n";
      t += "          for (int jj = 0; jj < valid; ++jj) {\n";
      t += "            const float x = fabsf(ks[jj * (kD + 1) + c]);\n";
      t += "            km = x > km || x != x ? x : km;  // NaN sticks\n          }\n";
      t += "          kmax[c] = km;\n        }\n";
    }
    t += "        __syncthreads();\n";
    t += "        if (lane == 0 && rv) {\n";
    if (causal->bool_mask) {
      t += StrCat("          const double rest = ", FloatLiteral(static_cast<float>(causal->bound)), ";\n");
    } else {
      t += "          double bound = 0;\n";
      t += "          for (long long c = 0; c < kD; ++c)\n";
      t += "            bound += static_cast<double>(fabsf(qs[i * (kD + 1) + c])) * static_cast<double>(kmax[c]);\n";
      t += StrCat("          const double rest = bound * ", std::abs(static_cast<double>(a.scale)) * 1.01,
                  " + static_cast<double>(", FloatLiteral(static_cast<float>(causal->bound)), ");\n");
    }
    t += "          if (!(rest < static_cast<double>(m) - 1000.0)) skip = 0;\n        }\n";
    t += "        __syncthreads();\n";
    t += "        if (skip) continue;  // the same for every thread\n      }\n";
  }
  // Scores of the thread's keys, and the row's max over the tile.
  t += "      float sv[kBc / kTpr], lm = kNegInf;\n";
  t += "      for (int w = 0; w < kBc / kTpr; ++w) {\n";
  t += "        const int jj = lane + w * kTpr;\n        const long long j = j0 + jj;\n";
  t += "        float sc = kNegInf;\n        if (rv && j < kSk) {\n          float dot = 0.f;\n";
  t += "          for (long long c = 0; c < kD; ++c) dot += qs[i * (kD + 1) + c] * ks[jj * (kD + 1) + c];\n";
  t += StrCat("          sc = ", FloatLiteral(a.scale), " * dot;\n");
  t += AttentionMaskLines(a, "          ", z);
  t += "          lm = gf::max(lm, sc);\n        }\n        sv[w] = sc;\n      }\n";
  t += "      pmax[i * kTpr + lane] = lm;\n      __syncthreads();\n";
  t += "      float mt = pmax[i * kTpr];\n";
  t += "      for (int u = 1; u < kTpr; ++u) mt = gf::max(mt, pmax[i * kTpr + u]);\n";
  t += "      const float mn = gf::max(m, mt);\n";
  t += "      const float mu = mn == kNegInf ? 0.f : mn;  // no finite score yet: exponentials of -inf are 0\n";
  t += "      const float alpha = expf(m - mu);\n";
  t += "      double ls = 0;\n";
  t += "      for (int w = 0; w < kBc / kTpr; ++w) {\n";
  t += "        const int jj = lane + w * kTpr;\n        float p = 0.f;\n";
  t += "        if (rv && j0 + jj < kSk) {\n          p = expf(sv[w] - mu);\n          ls += p;\n        }\n";
  t += "        ps[i * (kBc + 1) + jj] = p;\n      }\n";
  t += "      psum[i * kTpr + lane] = ls;\n      __syncthreads();\n";
  t += "      double lt = 0;\n      for (int u = 0; u < kTpr; ++u) lt += psum[i * kTpr + u];\n";
  t += "      l = l * static_cast<double>(alpha) + lt;\n      m = mn;\n";
  // P V into the accumulator.
  t += "      for (int u = 0; u < kAcc; ++u) {\n";
  t += "        const long long c = lane + u * kTpr;\n        if (c >= kDv) break;\n";
  t += "        float o = acc[u] * alpha;\n";
  t += "        for (int jj = 0; jj < kBc; ++jj) o += ps[i * (kBc + 1) + jj] * vs[jj * kDv + c];\n";
  t += "        acc[u] = o;\n      }\n    }\n";
  // 3. The rows' outputs.
  // Under zero_nan_rows (the guard Where(IsNaN(P), 0, P)): a row whose every score is -inf has
  // l = 0 and acc = 0 . V already (its exponentials were 0), which is what the guard gives; a
  // row that met a NaN or +inf score has l NaN and stores 0 (0 . V for finite V).
  const char* inv = d.zero_nan_rows ? "l == 0 ? 1.f : static_cast<float>(1.0 / l)" : "static_cast<float>(1.0 / l)";
  const char* value = d.zero_nan_rows ? "(l != l ? 0.f : acc[u] * inv)" : "acc[u] * inv";
  t += StrCat("    if (rv) {\n      const float inv = ", inv, ";\n");
  t += "      for (int u = 0; u < kAcc; ++u) {\n";
  t += "        const long long c = lane + u * kTpr;\n        if (c >= kDv) break;\n";
  t += StrCat("        ", StoreTo(a.out_dt, "oh", StrCat("r * ", z.Use("o_sr", oa.row_stride), " + c"), value), "\n");
  t += "      }\n    }\n  }\n}\n";
  t = WholeNodeParams(a) + z.Parameter() + ") {\n" + z.Declarations("  ") + t;
  k.sizes = z.values();
  const std::string base =
      StrCat(AttentionBaseName(d, "flash_attention"), "_br", tl.br, "_bc", tl.bc, causal ? "_causal" : "");
  return Finish(head, t, base, a.q_dt, std::move(k));
}

}  // namespace graphfuse::cuda
