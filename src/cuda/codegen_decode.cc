// FusedCachedAttention at decode as two generated kernels, flash-decoding style (codegen.h,
// GenerateDecodeAttentionKernels).
//
// split    one thread block per (batch, KV head, split of the keys), grid-stride over them. The
//          block takes the KV head's G = H / KV query heads times the S query rows (R = G * S
//          rows, each roped and kept in shared memory), so a key is read once for all the query
//          heads that share it. Its keys j in [j0, j0 + chunk) come from past_k / past_v (j < P)
//          or from k_new / v_new (j >= P: K roped with cos / sin as the CPU kernel's RopeRow);
//          each key and value is stored to present_k / present_v on the way (every key lies in
//          exactly one block's chunk, so every present row is written once). K is read in tiles
//          of kT keys into shared memory with consecutive threads on consecutive elements of the
//          rows (coalesced: past rows of a tile are one contiguous span), then each thread forms
//          scores scale * q.k (columns in order, as the CPU's dot) of one (row, key), taken
//          through the masks. Per row: the chunk's max m, the exponentials e_j = exp(s_j - m)
//          summed in double (l), and acc[c] = sum_j e_j v_j[c] (threads on consecutive columns:
//          coalesced V rows). The partial (m, l, acc) goes to scratch.
// combine  M = max of the splits' m, then out = sum_s acc_s exp(m_s - M) / sum_s l_s exp(m_s - M),
//          stored in the output layout. Done by the split kernel itself: each block, having
//          written its partial, fences and takes a ticket from its (batch, KV head)'s counter; the
//          block with the last ticket combines that head's rows (partials read past L1) and sets
//          the counter back to 0 for the next run, so a decode step is one launch. The separate
//          combine kernel (one block per (batch, head, query row)) serves where the counters do
//          not (DecodeSplitOptions::one_launch off).
//
// A chunk whose keys are all masked to -inf has m = -inf: its exponentials are taken against 0
// (all 0) and its weight exp(-inf - M) is 0; a row masked everywhere gives NaN, as on the CPU,
// or 0 under zero_nan_rows (FoldSplits).
// Operands and outputs are f32, f16 or bf16 (one dtype, the node's): loads go through gf::f32_of
// and stores through gf::store; accumulation stays f32, sums in double. A new key roped in f32 is
// rounded to the cache's dtype before its scores, so that the scores read the key present_k
// keeps (the next step reads it from there).
#include <algorithm>

#include "ir/schemas/attention_cache.h"
#include "cuda/codegen.h"
#include "cuda/codegen_attention.h"
#include "cuda/codegen_internal.h"
#include "core/hash.h"
#include "cuda/device_prelude.h"

namespace graphfuse::cuda {
namespace {

using namespace internal;

// Shared memory of the split kernel, in floats: the query rows (R * d), the scores of a chunk
// (R * chunk) and a tile of keys (kT * (d + 1), padded so that threads on consecutive keys
// read different banks). With the row statistics' 3 KB they stay under the 48 KB of static
// shared memory a block may take.
constexpr int64_t kQueryFloats = 4096, kScoreFloats = 4096, kTileFloats = 2048;
constexpr int64_t kMaxChunk = 512, kMaxTileKeys = 64, kStatThreads = 32;

CudaKernelSource Named(const std::string& head, const std::string& tail, const std::string& base, DType dt,
                       CudaKernelSource k) {
  k.name = StrCat(base, "_", DTypeName(dt), "_", Hash8(head + tail));
  k.source = head + k.name + tail;
  return k;
}

int64_t Ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Element c of one query row's output from the splits' partials: `pr` points at split 0's
// partial of the row (kStep floats to the next split's), `load` reads one float of them, `dst`
// is the output element. M = max of the splits' m; out = sum_s acc_s e_s / sum_s l_s e_s with
// e_s = exp(m_s - M), the denominator summed in double.
// zero_nan_rows (the guard Where(IsNaN(P), 0, P) absorbed): a row masked everywhere (M = -inf)
// weighs its splits against 0 (each e_s = 0, l = 0) and stores sum_s acc_s * 0, which is the
// guard's 0 . V (0 for finite V); a row that met a NaN or +inf score (l NaN) stores 0.
std::string FoldSplits(const std::string& in, const std::string& load, const std::string& dst, bool zero_nan_rows) {
  auto ld = [&](const std::string& off) { return StrCat(load, "(pr + s * kStep", off, ")"); };
  std::string t = StrCat(in, "float mx = -__int_as_float(0x7f800000);\n");
  t += StrCat(in, "for (long long s = 0; s < kSplits; ++s) mx = gf::max(mx, ", ld(""), ");\n");
  if (zero_nan_rows) t += StrCat(in, "if (mx == -__int_as_float(0x7f800000)) mx = 0.f;\n");
  t += StrCat(in, "double l = 0;\n", in, "float o = 0.f;\n");
  t += StrCat(in, "for (long long s = 0; s < kSplits; ++s) {\n");
  t += StrCat(in, "  const float w = expf(", ld(""), " - mx);\n");
  t += StrCat(in, "  l += static_cast<double>(", ld(" + 1"), ") * w;\n");
  t += StrCat(in, "  o += ", ld(" + 2 + c"), " * w;\n", in, "}\n");
  if (zero_nan_rows)
    t += StrCat(in, "gf::store(&", dst, ", l != l ? 0.f : l == 0 ? o : o * static_cast<float>(1.0 / l));\n");
  else
    t += StrCat(in, "gf::store(&", dst, ", o * static_cast<float>(1.0 / l));\n");
  return t;
}

}  // namespace

Result<DecodeAttentionKernels> GenerateDecodeAttentionKernels(const Node& node, const DecodeSplitOptions& opt) {
  const std::string where = StrCat("CUDA codegen: ", node.Describe());
  if (!node.is(op::FusedCachedAttention)) return InvalidArgument(where, ": not a FusedCachedAttention");
  GF_ASSIGN_OR_RETURN(schemas::CacheDims c, schemas::ReadCacheDims(node.attrs(), where));
  const schemas::Dims& d = c.att;
  if (static_cast<int>(node.inputs().size()) != d.num_inputs() + 2 || node.outputs().size() != 3)
    return InvalidArgument(where, ": input / output count");
  const DType dt = node.input(0) ? node.input(0)->dtype() : DType::kF32;
  for (size_t i = 0; i < node.inputs().size(); ++i) {
    const Value* v = node.input(i);
    const bool bool_mask = d.mask_select != 0 && static_cast<int>(i) == d.bool_mask_index() + 2;
    if (!v || !IsFloat(dt) || v->dtype() != (bool_mask ? DType::kBool : dt))
      return Unimplemented(where, ": float operands of one dtype only (and a bool mask that selects)");
  }
  if (d.q == schemas::Layout::kBHDS || d.out == schemas::Layout::kBHDS)
    return Unimplemented(where, ": q and the output are read and stored as rows");
  if (d.b * d.h * d.s * d.d * d.dv * d.sk == 0) return Unimplemented(where, ": an empty dimension");
  const int64_t group = d.h / d.kv_h, rows = group * d.s;  // query rows per block
  const int64_t chunk_cap = std::min(kMaxChunk, kScoreFloats / rows);
  if (rows > kCudaBlockSize || rows * d.d > kQueryFloats || chunk_cap < 1 || d.d + 1 > kTileFloats)
    return Unimplemented(where, ": ", rows, " query rows of head_dim ", d.d, " per KV head exceed the decode kernel's ",
                         "shared memory (", kQueryFloats, " query floats, ", kCudaBlockSize, " rows)");

  // Splits: enough blocks for every multiprocessor (batch x KV heads x splits >= sms), chunks
  // of at least min_keys_per_split keys, and at most chunk_cap keys (the scores' shared memory).
  const int64_t heads = d.b * d.kv_h;
  const int64_t want = std::min(Ceil(std::max<int64_t>(opt.sms, 1), heads),
                                Ceil(d.sk, std::max<int64_t>(opt.min_keys_per_split, 1)));
  int64_t splits = std::max({Ceil(d.sk, chunk_cap), want, int64_t{1}});
  const int64_t chunk = Ceil(d.sk, splits);
  splits = Ceil(d.sk, chunk);
  // Tiles of at most kTileFloats, as even as the chunk allows (32 keys: one tile, not 31 + 1).
  const int64_t tile_cap = std::clamp<int64_t>(kTileFloats / (d.d + 1), 1, kMaxTileKeys);
  const int64_t tile = Ceil(chunk, Ceil(chunk, tile_cap));
  const int64_t stat = std::max<int64_t>(1, std::min(kStatThreads, kCudaBlockSize / rows));

  DecodeAttentionKernels out;
  out.splits = splits, out.chunk = chunk, out.rows = rows;
  out.partial_elements = heads * splits * rows * (d.dv + 2);

  const schemas::HeadAccess qa = schemas::Access(d.q, d, d.h, d.s, d.d), oa = schemas::Access(d.out, d, d.h, d.s, d.dv);
  const schemas::HeadAccess ka = schemas::Access(c.new_k, d, d.kv_h, c.rows, d.d);
  const schemas::HeadAccess va = schemas::Access(c.new_v, d, d.kv_h, c.rows, d.dv);
  std::vector<int64_t> ms, bms, cq, ck;
  size_t next = schemas::CacheDims::kFirstExtra;
  if (d.mask) ms = BroadcastStrides(node.input(next++)->shape(), Shape{d.b, d.h, d.s, d.sk});
  if (d.mask_select != 0) bms = BroadcastStrides(node.input(next++)->shape(), Shape{d.b, d.h, d.s, d.sk});
  if (d.rope_q) {
    cq = BroadcastStrides(node.input(next)->shape(), Shape{d.b, d.h, d.s, d.d});
    ck = BroadcastStrides(node.input(next)->shape(), Shape{d.b, d.kv_h, c.rows, d.d});
  }
  const float scale = node.GetFloat("scale", 1.f), mask_scale = node.GetFloat("mask_scale", 1.f);
  auto type = [&](size_t i) { return std::string(StorageType(node.input(i)->dtype())); };
  auto otype = [&](size_t o) { return std::string(StorageType(node.output(o)->dtype())); };
  const std::string name_part = StrCat(d.rope_q ? "_rope" : "", d.mask ? "_mask" : "", d.mask_select != 0 ? "_boolmask" : "",
                                       "_h", d.h, d.kv_h != d.h ? StrCat("_kv", d.kv_h) : std::string(), "_d", d.d);

  // ---- the split kernel ----
  CudaKernelSource& sk = out.split;
  sk.row_kernel = true;
  sk.scalar_work_items = heads * splits;
  sk.num_elements = sk.scalar_work_items * rows * (d.dv + 2);
  for (const Value* v : node.inputs()) sk.input_dtypes.push_back(v->dtype());
  sk.output_dtypes = {node.output(1)->dtype(), node.output(2)->dtype(), DType::kF32};
  std::string head = kDevicePrelude;
  head += "\n}  // namespace gf\n\n";
  head += StrCat("extern \"C\" __global__ void __launch_bounds__(", kCudaBlockSize, ") ");
  std::string params = StrCat("(const ", type(0), "* __restrict__ q, const ", type(1), "* __restrict__ k_new, const ",
                              type(2), "* __restrict__ v_new, const ", type(3), "* __restrict__ past_k, const ", type(4),
                              "* __restrict__ past_v");
  next = schemas::CacheDims::kFirstExtra;
  if (d.mask) params += StrCat(", const ", type(next++), "* __restrict__ mask");
  if (d.mask_select != 0) params += StrCat(", const ", type(next++), "* __restrict__ bmask");
  if (d.rope_q) params += StrCat(", const ", type(next), "* __restrict__ cs, const ", type(next + 1), "* __restrict__ sn");
  params += StrCat(", ", otype(1), "* __restrict__ present_k, ", otype(2), "* __restrict__ present_v, float* __restrict__ part");
  if (opt.one_launch) params += StrCat(", int* __restrict__ tickets, ", otype(0), "* __restrict__ out");
  // The cache's length and how its keys split are sizes; the query rows a block holds (the
  // step's new tokens times the group) and head_dim are in the source, and so are the shared
  // arrays' bounds they give.
  KernelSizes z;
  z.Use("kP", c.past);
  z.Use("kSk", d.sk);
  z.Use("kChunk", chunk);
  z.Use("kSplits", splits);
  z.Use("kT", tile);
  std::string t = StrCat("  constexpr long long kKv = ", d.kv_h, "LL, kG = ", group, "LL, kS = ", d.s, "LL, kD = ", d.d,
                         "LL, kDv = ", d.dv, "LL, kHalf = ", d.d / 2, "LL;\n");
  t += StrCat("  constexpr long long kR = ", rows, "LL, kChunkCap = ", chunk_cap, "LL, kTileCap = ", tile_cap,
              "LL, kTs = kD + 1, kStat = ", stat, "LL;\n");
  t += "  __shared__ float qs[kR * kD];         // the block's query rows, roped\n";
  t += "  __shared__ float ks[kTileCap * kTs];  // a tile of keys, rows padded by one\n";
  t += "  __shared__ float ps[kR * kChunkCap];  // scores, then exponentials, of the chunk\n";
  t += StrCat("  __shared__ float rmax[", kCudaBlockSize, "];\n  __shared__ double rsum[", kCudaBlockSize, "];\n");
  t += "  const long long tid = threadIdx.x;\n";
  t += StrCat("  for (long long item = blockIdx.x; item < ", z.Use("kItems", heads * splits), "; item += gridDim.x) {\n");
  t += "    const long long split = item % kSplits, bk = item / kSplits, kh = bk % kKv, b = bk / kKv;\n";
  t += "    const long long j0 = split * kChunk, len = gf::min(kChunk, kSk - j0);\n";
  t += "    __syncthreads();  // the previous item's readers are done with qs, ps and the statistics\n";
  // Query rows rr = g * S + r of heads h = kh * G + g, roped (x*cos + rotate_half(x)*sin, each
  // product rounded, then the add: RopeRow's arithmetic).
  t += StrCat("    for (long long i = tid; i < kR * kD; i += ", kCudaBlockSize, ") {\n");
  t += "      const long long c = i % kD, rr = i / kD, r = rr % kS, h = kh * kG + rr / kS;\n";
  t += StrCat("      const ", type(0), "* qh = q + ", HeadRow(z, "q", qa, "h", "r"), ";\n");
  if (d.rope_q) {
    t += RopedStore(dt, dt, [](const std::string& col) { return StrCat("gf::f32_of(qh[", col, "])"); }, cq, "r", "qs[i]",
                    "      ", z, "cq");
  } else {
    t += "      qs[i] = gf::f32_of(qh[c]);\n";
  }
  t += "    }\n";
  // Keys, a tile at a time.
  t += StrCat("    const ", type(1), "* kn = k_new + ", HeadRow(z, "k", ka, "kh", ""), ";\n");
  t += "    for (long long t0 = 0; t0 < len; t0 += kT) {\n";
  t += "      const long long tn = gf::min(kT, len - t0);\n";
  t += "      __syncthreads();  // qs is written; the previous tile's readers are done with ks\n";
  t += StrCat("      for (long long i = tid; i < tn * kD; i += ", kCudaBlockSize, ") {\n");
  t += "        const long long c = i % kD, jj = i / kD, j = j0 + t0 + jj;\n";
  t += "        float x;\n";
  t += "        if (j < kP) {\n          x = gf::f32_of(past_k[(bk * kP + j) * kD + c]);\n        } else {\n";
  t += StrCat("          const long long n = j - kP;\n          const ", type(1), "* kr = kn + n * ",
              z.Use("k_sr", ka.row_stride), ";\n");
  if (c.rope_new_k) {
    t += RopedStore(dt, dt, [](const std::string& col) { return StrCat("gf::f32_of(kr[", col, "])"); }, ck, "n", "x",
                    "          ", z, "ck", "kh");
    if (dt != DType::kF32) t += StrCat("          x = gf::round_", DTypeName(dt), "(x);\n");
  } else {
    t += "          x = gf::f32_of(kr[c]);\n";
  }
  t += "        }\n";
  t += "        ks[jj * kTs + c] = x;\n";
  t += "        gf::store(&present_k[(bk * kSk + j) * kD + c], x);\n      }\n";
  t += "      __syncthreads();\n";
  // Scores: thread i takes key jj = i % tn of row rr = i / tn.
  t += StrCat("      for (long long i = tid; i < tn * kR; i += ", kCudaBlockSize, ") {\n");
  t += "        const long long jj = i % tn, rr = i / tn, r = rr % kS, h = kh * kG + rr / kS, j = j0 + t0 + jj;\n";
  t += "        (void)r, (void)h;\n";
  t += "        const float* qr = qs + rr * kD;\n        const float* kr = ks + jj * kTs;\n";
  t += "        float acc = 0.f;\n        for (long long c = 0; c < kD; ++c) acc += qr[c] * kr[c];\n";
  t += StrCat("        float sc = ", FloatLiteral(scale), " * acc;\n");
  {  // the masks, in the node's order (as the FusedAttention kernels apply them)
    std::string select;
    if (d.mask_select != 0) {
      const std::string boff = StridedOffset(z, "bms", {"b", "h", "r", "j"}, bms);
      select = StrCat("        sc = gf::f32_of(bmask[", boff, "]) ", d.mask_select > 0 ? "!=" : "==", " 0.f ? sc : ",
                      FloatLiteral(d.mask_fill), ";\n");
    }
    if (d.select_first || !d.mask) t += select;
    if (d.mask) {
      const std::string moff = StridedOffset(z, "ms", {"b", "h", "r", "j"}, ms);
      t += mask_scale == 1.f ? StrCat("        sc = sc + gf::f32_of(mask[", moff, "]);\n")
                             : StrCat("        sc = sc + gf::f32_of(mask[", moff, "]) * ", FloatLiteral(mask_scale), ";\n");
      if (!d.select_first) t += select;
    }
  }
  t += "        ps[rr * kChunk + t0 + jj] = sc;\n      }\n    }\n";
  t += "    __syncthreads();\n";
  // Row statistics: kStat threads per row take strided keys; every thread of a row then folds
  // the row's kStat partials in the same order, so all of them hold the same max.
  t += "    const long long srow = tid / kStat, sl = tid % kStat;\n";
  t += "    const bool stats = srow < kR;\n";
  t += "    float m = -__int_as_float(0x7f800000);\n";
  t += "    if (stats)\n      for (long long jj = sl; jj < len; jj += kStat) m = gf::max(m, ps[srow * kChunk + jj]);\n";
  t += "    rmax[tid] = m;\n    __syncthreads();\n";
  t += "    if (stats) {\n";
  t += "      m = rmax[srow * kStat];\n      for (long long u = 1; u < kStat; ++u) m = gf::max(m, rmax[srow * kStat + u]);\n";
  t += "      const float mr = m == -__int_as_float(0x7f800000) ? 0.f : m;  // all -inf: every exponential is 0\n";
  t += "      double sum = 0;\n";
  t += "      for (long long jj = sl; jj < len; jj += kStat) {\n";
  t += "        const float e = expf(ps[srow * kChunk + jj] - mr);\n        ps[srow * kChunk + jj] = e;\n        sum += e;\n";
  t += "      }\n      rsum[tid] = sum;\n    }\n";
  t += "    __syncthreads();  // also orders the exponentials' writes before the reads below\n";
  t += "    float* pi = part + item * kR * (kDv + 2);\n";
  t += "    if (stats && sl == 0) {\n";
  t += "      double l = 0;\n      for (long long u = 0; u < kStat; ++u) l += rsum[srow * kStat + u];\n";
  t += "      pi[srow * (kDv + 2)] = m;\n      pi[srow * (kDv + 2) + 1] = static_cast<float>(l);\n    }\n";
  // Values: thread i takes column c = i % Dv of row rr = i / Dv; the threads of row 0 also
  // store the present V rows.
  t += StrCat("    const ", type(2), "* vn = v_new + ", HeadRow(z, "v", va, "kh", ""), ";\n");
  t += StrCat("    for (long long i = tid; i < kR * kDv; i += ", kCudaBlockSize, ") {\n");
  t += "      const long long c = i % kDv, rr = i / kDv;\n";
  t += "      const float* pr = ps + rr * kChunk;\n";
  t += "      float o = 0.f;\n";
  t += "      for (long long jj = 0; jj < len; ++jj) {\n";
  t += "        const long long j = j0 + jj;\n";
  t += StrCat("        const float x = j < kP ? gf::f32_of(past_v[(bk * kP + j) * kDv + c]) : gf::f32_of(vn[(j - kP) * ",
              z.Use("v_sr", va.row_stride), " + c]);\n");
  t += "        if (rr == 0) gf::store(&present_v[(bk * kSk + j) * kDv + c], x);\n";
  t += "        o += pr[jj] * x;\n      }\n";
  t += "      pi[rr * (kDv + 2) + 2 + c] = o;\n    }\n";
  if (opt.one_launch) {
    // The last of the head's splits to finish combines (the threadFenceReduction pattern).
    t += "    __shared__ bool last;\n";
    t += "    __threadfence();  // this block's partials are visible device-wide before its ticket\n";
    t += "    __syncthreads();\n";
    t += "    if (tid == 0) last = atomicAdd(&tickets[bk], 1) == kSplits - 1;\n";
    t += "    __syncthreads();\n";
    t += "    if (last) {\n";
    t += "      __threadfence();\n";
    t += "      const float* p0 = part + bk * kSplits * kR * (kDv + 2);  // split 0, row 0 of the head\n";
    t += "      constexpr long long kStep = kR * (kDv + 2);  // from one split's partial of a row to the next\n";
    t += StrCat("      for (long long i = tid; i < kR * kDv; i += ", kCudaBlockSize, ") {\n");
    t += "        const long long c = i % kDv, rr = i / kDv, r = rr % kS, h = kh * kG + rr / kS;\n";
    t += "        const float* pr = p0 + rr * (kDv + 2);\n";
    t += FoldSplits("        ", "__ldcg", StrCat("out[", HeadRow(z, "o", oa, "h", "r"), " + c]"), d.zero_nan_rows);
    t += "      }\n";
    t += "      if (tid == 0) tickets[bk] = 0;  // ready for the next run\n";
    t += "    }\n";
  }
  t += "  }\n}\n";
  t = params + z.Parameter() + ") {\n" + z.Declarations("  ") + t;
  sk.sizes = z.values();
  if (opt.one_launch) sk.output_dtypes.insert(sk.output_dtypes.end(), {DType::kI32, node.output(0)->dtype()});
  sk = Named(head, t, StrCat(opt.one_launch ? "decode_attention" : "decode_attention_split", name_part), dt,
             std::move(sk));
  out.tickets = opt.one_launch ? heads : 0;
  if (opt.one_launch) return out;

  // ---- the combine kernel ----
  CudaKernelSource& ck_ = out.combine;
  ck_.row_kernel = true;
  ck_.scalar_work_items = d.b * d.h * d.s;
  ck_.num_elements = ck_.scalar_work_items * d.dv;
  ck_.input_dtypes = {DType::kF32};
  ck_.output_dtypes = {node.output(0)->dtype()};
  KernelSizes zc;
  zc.Use("kSplits", splits);
  t = StrCat("  constexpr long long kH = ", d.h, "LL, kKv = ", d.kv_h, "LL, kG = ", group, "LL, kS = ", d.s,
             "LL, kDv = ", d.dv, "LL, kR = ", rows, "LL;\n");
  t += StrCat("  for (long long item = blockIdx.x; item < ", zc.Use("kItems", d.b * d.h * d.s), "; item += gridDim.x) {\n");
  t += "    const long long r = item % kS, bh = item / kS, h = bh % kH, b = bh / kH, kh = h / kG, rr = (h % kG) * kS + r;\n";
  t += "    const float* pr = part + ((b * kKv + kh) * kSplits * kR + rr) * (kDv + 2);  // split 0 of the row\n";
  t += "    constexpr long long kStep = kR * (kDv + 2);  // from one split's partial of the row to the next\n";
  t += StrCat("    ", otype(0), "* oh = out + ", HeadRow(zc, "o", oa, "h", "r"), ";\n");
  t += StrCat("    for (long long c = threadIdx.x; c < kDv; c += ", kCudaBlockSize, ") {\n");
  t += FoldSplits("      ", "*", "oh[c]", d.zero_nan_rows);
  t += "    }\n  }\n}\n";
  t = StrCat("(const float* __restrict__ part, ", otype(0), "* __restrict__ out", zc.Parameter(), ") {\n",
             zc.Declarations("  "), t);
  ck_.sizes = zc.values();
  ck_ = Named(head, t, StrCat("decode_attention_combine", name_part), dt, std::move(ck_));
  return out;
}

}  // namespace graphfuse::cuda
