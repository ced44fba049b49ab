// CUDA C for FusedAttention (the node: src/ir/schemas/attention_layout.h; its CPU kernel:
// src/cpu/kernels/attention.cc), in three forms that share how they read the node:
//   - one kernel with a thread block per query row (GenerateAttentionKernel: few rows, decode);
//   - GEMMs: a prep kernel and a softmax kernel around two cuBLAS calls
//     (GenerateAttentionGemmKernels);
//   - one flash-style kernel with a thread block per tile of query rows, K / V staged in
//     shared memory tile by tile under an online softmax (GenerateFlashAttentionKernel;
//     codegen_flash.cc).
// Float operands of any dtype are loaded into f32; scores, softmax and weighted sums are f32
// (sums of exponentials in double); the output is rounded once when stored.
#include <algorithm>
#include <functional>

#include "ir/schemas/attention_layout.h"
#include "cuda/codegen.h"
#include "cuda/codegen_attention.h"
#include "cuda/codegen_internal.h"
#include "cuda/device_prelude.h"

namespace graphfuse::cuda {

using namespace internal;

namespace internal {

Result<AttentionParts> ReadAttention(const Node& node, const std::string& where) {
  AttentionParts a;
  schemas::Dims& d = a.d;
  GF_ASSIGN_OR_RETURN(d, schemas::ReadDims(node.attrs(), where));
  if (d.proj)
    return Unimplemented(where, ": no generated kernel for the projected form (the QKV GEMM inside)");
  if (d.softcap != 0.f) return Unimplemented(where, ": no generated kernel soft-caps the scores");
  if ((d.rope_q || d.rope_k) && (d.rope_dim != d.d || d.rope_interleaved || d.rope_tables_bshd))
    return Unimplemented(where, ": no generated kernel rotates part of a head, interleaved pairs, or with "
                                "[B,S,H,r] tables");
  if (static_cast<int>(node.inputs().size()) != d.num_inputs()) return InvalidArgument(where, ": input count");
  for (size_t i = 0; i < node.inputs().size(); ++i) {
    const Value* v = node.input(i);
    const bool bool_mask = d.mask_select != 0 && static_cast<int>(i) == d.bool_mask_index();  // Where's mask
    if (!v || (bool_mask ? v->dtype() != DType::kBool : !IsFloat(v->dtype())))
      return Unimplemented(where, ": float operands only (and a bool mask that selects)");
  }
  if (!node.output() || !IsFloat(node.output()->dtype())) return Unimplemented(where, ": a float output only");
  a.q_dt = node.input(0)->dtype(), a.k_dt = node.input(1)->dtype(), a.v_dt = node.input(2)->dtype();
  a.out_dt = node.output()->dtype();
  a.qa = schemas::Access(d.q, d, d.h, d.s, d.d), a.ka = schemas::Access(d.k, d, d.kv_h, d.sk, d.d);
  a.va = schemas::Access(d.v, d, d.kv_h, d.sk, d.dv), a.oa = schemas::Access(d.out, d, d.h, d.s, d.dv);
  a.kt = d.k == schemas::Layout::kBHDS;
  size_t next = 3;
  if (d.mask) {
    a.mask_dt = node.input(next)->dtype();
    a.ms = BroadcastStrides(node.input(next++)->shape(), Shape{d.b, d.h, d.s, d.sk});
  }
  if (d.mask_select != 0) a.bms = BroadcastStrides(node.input(next++)->shape(), Shape{d.b, d.h, d.s, d.sk});
  if (d.rope_q || d.rope_k) {
    a.cos_dt = node.input(next)->dtype(), a.sin_dt = node.input(next + 1)->dtype();
    a.cq = BroadcastStrides(node.input(next)->shape(), Shape{d.b, d.h, d.s, d.d});
    a.ck = BroadcastStrides(node.input(next)->shape(), Shape{d.b, d.kv_h, d.sk, d.d});
  }
  a.kvh = d.kv_h == d.h ? "h" : StrCat("(h / ", d.h / d.kv_h, "LL)");
  a.scale = node.GetFloat("scale", 1.f), a.mask_scale = node.GetFloat("mask_scale", 1.f);
  return a;
}

std::string StridedOffset(KernelSizes& z, const std::string& name, const std::vector<std::string>& index,
                          const std::vector<int64_t>& strides) {
  std::string t;
  for (size_t k = 0; k < index.size(); ++k)
    if (strides[k] != 0) t += StrCat(t.empty() ? "" : " + ", index[k], " * ", z.Use(StrCat(name, k), strides[k]));
  return t.empty() ? "0" : t;
}

std::string HeadRow(KernelSizes& z, const std::string& name, const schemas::HeadAccess& acc, const std::string& head,
                    const std::string& row) {
  // One size a statement: the order they are named in is the order of z.
  std::string t = StrCat("b * ", z.Use(name + "_sb", acc.head_stride_b));
  t += StrCat(" + ", head, " * ", z.Use(name + "_sh", acc.head_stride_h));
  return row.empty() ? t : StrCat(t, " + ", row, " * ", z.Use(name + "_sr", acc.row_stride));
}

std::string AttentionMaskLines(const AttentionParts& a, const std::string& indent, KernelSizes& z) {
  const schemas::Dims& d = a.d;
  std::string select;  // Where(bmask, scores, fill) / Where(bmask, fill, scores)
  if (d.mask_select != 0) {
    const std::string boff = StridedOffset(z, "bms", {"b", "h", "r", "j"}, a.bms);
    select = StrCat(indent, "sc = ", d.mask_select > 0 ? "" : "!", "bmask[", boff, "] ? sc : ", FloatLiteral(d.mask_fill), ";\n");
  }
  std::string t;
  if (d.select_first || !d.mask) t += select;
  if (d.mask) {
    const std::string moff = StridedOffset(z, "ms", {"b", "h", "r", "j"}, a.ms);
    const std::string m = LoadF32(a.mask_dt, StrCat("mask[", moff, "]"));
    t += a.mask_scale == 1.f ? StrCat(indent, "sc = sc + ", m, ";\n")
                             : StrCat(indent, "sc = sc + ", m, " * ", FloatLiteral(a.mask_scale), ";\n");
    if (!d.select_first) t += select;
  }
  return t;
}

std::string MaskSuffix(const schemas::Dims& d) {
  return StrCat(d.mask ? "_mask" : "", d.mask_select != 0 ? "_boolmask" : "");
}

std::string AttentionBaseName(const schemas::Dims& d, const std::string& stem) {
  return StrCat(stem, d.rope_q || d.rope_k ? "_rope" : "", MaskSuffix(d), "_h", d.h,
                d.kv_h != d.h ? StrCat("_kv", d.kv_h) : std::string(), "_d", d.d);
}

std::string RopedStore(DType cos_dt, DType sin_dt, const std::function<std::string(const std::string&)>& at,
                       const std::vector<int64_t>& cs, const std::string& row, const std::string& dst,
                       const std::string& indent, KernelSizes& z, const std::string& cs_name, const std::string& head) {
  std::string t = StrCat(indent, "const long long co = ", StridedOffset(z, cs_name, {"b", head, row, "c"}, cs), ";\n");
  t += StrCat(indent, "const float x2 = c < kHalf ? -", at("c + kHalf"), " : ", at("c - kHalf"), ";\n");
  t += StrCat(indent, "const float a = ", at("c"), " * ", LoadF32(cos_dt, "cs[co]"), ";\n");
  t += StrCat(indent, "const float s = x2 * ", LoadF32(sin_dt, "sn[co]"), ";\n");
  return t + StrCat(indent, dst, " = a + s;\n");
}

std::string ConstPtr(DType dt, const std::string& name) {
  return StrCat("const ", StorageType(dt), "* __restrict__ ", name);
}

std::string WholeNodeParams(const AttentionParts& a) {
  const schemas::Dims& d = a.d;
  std::string t = StrCat("(", ConstPtr(a.q_dt, "q"), ", ", ConstPtr(a.k_dt, "k"), ", ", ConstPtr(a.v_dt, "v"));
  if (d.mask) t += ", " + ConstPtr(a.mask_dt, "mask");
  if (d.mask_select != 0) t += ", const unsigned char* __restrict__ bmask";
  if (d.rope_q || d.rope_k) t += StrCat(", ", ConstPtr(a.cos_dt, "cs"), ", ", ConstPtr(a.sin_dt, "sn"));
  return t + StrCat(", ", StorageType(a.out_dt), "* __restrict__ out");
}

std::string HeadDims(const AttentionParts& a, KernelSizes& z) {
  const schemas::Dims& d = a.d;
  z.Use("kS", d.s);
  z.Use("kSk", d.sk);
  return StrCat("  constexpr long long kH = ", d.h, "LL, kD = ", d.d, "LL, kDv = ", d.dv, "LL, kHalf = ", d.d / 2, "LL;\n");
}

}  // namespace internal

namespace {

// The operands q, k, v and the RoPE tables (when roped), as parameters.
std::string QkvParams(const AttentionParts& a, bool rope) {
  std::string t = StrCat(ConstPtr(a.q_dt, "q"), ", ", ConstPtr(a.k_dt, "k"), ", ", ConstPtr(a.v_dt, "v"));
  if (rope) t += StrCat(", ", ConstPtr(a.cos_dt, "cs"), ", ", ConstPtr(a.sin_dt, "sn"));
  return t;
}

// The end of a score loop over keys j and the pass after it, shared by both attention forms:
// sc = scale * `score` through the masks, stored to `row`[j] and folded into the running max
// m; the block's max; then each score replaced by its exponential, summed in double (sum).
std::string ScoresToExponentials(const AttentionParts& a, const std::string& row, const std::string& score,
                                 KernelSizes& z) {
  std::string t = StrCat("      float sc = ", FloatLiteral(a.scale), " * ", score, ";\n");
  t += AttentionMaskLines(a, "      ", z);
  t += StrCat("      ", row, "[j] = sc;\n      m = gf::max(m, sc);\n    }\n");
  t += "    m = gf::block_max(m);\n";
  t += "    double sum = 0;\n";
  t += StrCat("    for (long long j = threadIdx.x; j < kSk; j += ", kCudaBlockSize, ") {\n");
  t += StrCat("      const float e = expf(", row, "[j] - m);\n      ", row, "[j] = e;\n      sum += e;\n    }\n");
  return t;
}

// After ScoresToExponentials: the row's sum (every thread holds it; the reduction also orders
// the exponentials' writes before any read) and inv = 1 / sum. Under zero_nan_rows a NaN row
// (sum NaN: every key masked to -inf, or a NaN or +inf score) has its exponentials read as 0,
// as the guard Where(IsNaN(P), 0, P) gives: `nan_row` says so, and inv is 0.
std::string RowSumAndInverse(const AttentionParts& a, const std::string& comment) {
  if (!a.d.zero_nan_rows) return StrCat("    const float inv = static_cast<float>(1.0 / gf::block_sum(sum));", comment, "\n");
  std::string t = StrCat("    const double total = gf::block_sum(sum);", comment, "\n");
  t += "    const bool nan_row = total != total;  // zero_nan_rows: this row of P is zeros\n";
  t += "    const float inv = nan_row ? 0.f : static_cast<float>(1.0 / total);\n";
  return t;
}

// Exponential j of `row` as P V reads it: 0 in a NaN row under zero_nan_rows.
std::string Weight(const AttentionParts& a, const std::string& e) {
  return a.d.zero_nan_rows ? StrCat("(nan_row ? 0.f : ", e, ")") : e;
}

}  // namespace

// FusedAttention: one thread block per (batch, head, query row), grid-stride over them. The
// (roped) query row goes to shared memory; each thread takes keys j = t, t + 256, ... and
// forms scale * q.k_j (K roped on the fly) + mask_scale * mask (or, for a bool mask, keeps it
// or takes mask_fill: mask_select); the row's max and sum of
// exponentials are block reductions (sum in double); each thread then forms output columns as
// sum_j p_j v_j[c] and scales them by 1/sum, written in the output layout. Scores of one row
// live in shared memory of kMaxAttentionKeys floats whatever the keys (so that one source
// serves every length): at most that many keys. Float operands of any dtype are read
// into f32 (the query row and scores stay f32), the output rounded once when stored.
Result<CudaKernelSource> GenerateAttentionKernel(const Node& node) {
  const std::string where = StrCat("CUDA codegen: ", node.Describe());
  GF_ASSIGN_OR_RETURN(AttentionParts a, ReadAttention(node, where));
  const schemas::Dims& d = a.d;
  constexpr int64_t kMaxAttentionKeys = 8192, kMaxHeadDim = 1024;
  if (d.sk > kMaxAttentionKeys || d.d > kMaxHeadDim)
    return Unimplemented(where, ": ", d.sk, " keys of head_dim ", d.d, " exceed the generated kernel's shared memory (",
                         kMaxAttentionKeys, " keys, head_dim ", kMaxHeadDim, ")");
  const schemas::HeadAccess &qa = a.qa, &ka = a.ka, &va = a.va, &oa = a.oa;
  const bool kt = a.kt;
  const std::vector<int64_t> &cq = a.cq, &ck = a.ck;
  CudaKernelSource k;
  k.num_elements = d.b * d.h * d.s * d.dv;
  k.row_kernel = true;
  k.scalar_work_items = d.b * d.h * d.s;  // one block per query row
  for (const Value* v : node.inputs()) k.input_dtypes.push_back(v->dtype());
  k.output_dtypes = {a.out_dt};

  std::string head = kDevicePrelude;
  head += kRowPrelude;
  head += "\n}  // namespace gf\n\n";
  head += StrCat("extern \"C\" __global__ void __launch_bounds__(", kCudaBlockSize, ") ");
  KernelSizes z;
  std::string t = HeadDims(a, z);
  t += StrCat("  __shared__ float qs[", std::max<int64_t>(d.d, 1), "];\n  __shared__ float ps[", kMaxAttentionKeys, "];\n");
  t += StrCat("  for (long long item = blockIdx.x; item < ", z.Use("kItems", d.b * d.h * d.s), "; item += gridDim.x) {\n");
  t += "    const long long r = item % kS, bh = item / kS, h = bh % kH, b = bh / kH;\n";
  t += StrCat("    const ", StorageType(a.q_dt), "* qh = q + ", HeadRow(z, "q", qa, "h", "r"), ";\n");
  t += StrCat("    const ", StorageType(a.k_dt), "* kh = k + ", HeadRow(z, "k", ka, a.kvh, ""), ";\n");
  t += StrCat("    const ", StorageType(a.v_dt), "* vh = v + ", HeadRow(z, "v", va, a.kvh, ""), ";\n");
  t += StrCat("    ", StorageType(a.out_dt), "* oh = out + ", HeadRow(z, "o", oa, "h", "r"), ";\n");
  // The query row (roped: x*cos + rotate_half(x)*sin, each product rounded, then the add).
  t += "    __syncthreads();  // the previous row's readers are done with qs and ps\n";
  t += StrCat("    for (long long c = threadIdx.x; c < kD; c += ", kCudaBlockSize, ") {\n");
  auto read_q = [&](const std::string& col) { return LoadF32(a.q_dt, StrCat("qh[", col, "]")); };
  if (d.rope_q) {
    t += RopedStore(a.cos_dt, a.sin_dt, read_q, cq, "r", "qs[c]", "      ", z, "cq");
  } else {
    t += StrCat("      qs[c] = ", read_q("c"), ";\n");
  }
  t += "    }\n    __syncthreads();\n";
  // Scores.
  t += "    float m = -__int_as_float(0x7f800000);\n";
  t += StrCat("    for (long long j = threadIdx.x; j < kSk; j += ", kCudaBlockSize, ") {\n");
  t += "      float acc = 0.f;\n";
  if (d.rope_k) {
    auto kr = [&](const std::string& col) { return LoadF32(a.k_dt, StrCat("kr[", col, "]")); };
    t += StrCat("      const ", StorageType(a.k_dt), "* kr = kh + j * ", z.Use("k_sr", ka.row_stride), ";\n");
    t += StrCat("      const long long co = ", StridedOffset(z, "ck", {"b", a.kvh, "j"}, {ck[0], ck[1], ck[2]}), ";\n");
    const std::string cc = StridedOffset(z, "ck", {"", "", "", "c"}, {0, 0, 0, ck[3]});
    t += "      for (long long c = 0; c < kD; ++c) {\n";
    t += StrCat("        const float x2 = c < kHalf ? -", kr("c + kHalf"), " : ", kr("c - kHalf"), ";\n");
    t += StrCat("        const float a = ", kr("c"), " * ", LoadF32(a.cos_dt, StrCat("cs[co + ", cc, "]")), ";\n");
    t += StrCat("        const float s = x2 * ", LoadF32(a.sin_dt, StrCat("sn[co + ", cc, "]")), ";\n");
    t += "        acc += qs[c] * (a + s);\n      }\n";
  } else if (kt) {
    t += StrCat("      for (long long c = 0; c < kD; ++c) acc += qs[c] * ",
                LoadF32(a.k_dt, StrCat("kh[c * ", z.Use("k_sr", ka.row_stride), " + j]")), ";\n");
  } else {
    t += StrCat("      const ", StorageType(a.k_dt), "* kr = kh + j * ", z.Use("k_sr", ka.row_stride), ";\n");
    t += StrCat("      for (long long c = 0; c < kD; ++c) acc += qs[c] * ", LoadF32(a.k_dt, "kr[c]"), ";\n");
  }
  t += ScoresToExponentials(a, "ps", "acc", z);
  t += RowSumAndInverse(a, "  // also orders ps's writes before the reads");
  t += StrCat("    for (long long c = threadIdx.x; c < kDv; c += ", kCudaBlockSize, ") {\n");
  t += "      float o = 0.f;\n";
  t += StrCat("      for (long long j = 0; j < kSk; ++j) o += ", Weight(a, "ps[j]"), " * ",
              LoadF32(a.v_dt, StrCat("vh[j * ", z.Use("v_sr", va.row_stride), " + c]")), ";\n");
  t += StrCat("      ", StoreTo(a.out_dt, "oh", "c", "o * inv"), "\n    }\n  }\n}\n");
  t = WholeNodeParams(a) + z.Parameter() + ") {\n" + z.Declarations("  ") + t;
  k.sizes = z.values();
  return Finish(head, t, AttentionBaseName(d, "attention"), a.q_dt, std::move(k));
}

// The GEMM form's two kernels (see codegen.h). The prep kernel is three grid-stride loops in
// the scratch's order (coalesced stores): q and k roped as in GenerateAttentionKernel, v
// copied. The softmax kernel is the one-kernel form's score pass on rows that cuBLAS filled
// with q.k: scale, masks, max, exponentials summed in double, then p = e / sum. The scratch is
// f32 whatever the operands' dtype (the prep kernel converts), and so is the output that
// cuBLAS's p v writes: an f16 / bf16 output is refused (the one-kernel form takes it).
Result<AttentionGemmKernels> GenerateAttentionGemmKernels(const Node& node) {
  const std::string where = StrCat("CUDA codegen: ", node.Describe());
  GF_ASSIGN_OR_RETURN(AttentionParts a, ReadAttention(node, where));
  const schemas::Dims& d = a.d;
  if (d.out == schemas::Layout::kBHDS)
    return Unimplemented(where, ": the GEMM form stores rows of the output; it is laid out transposed");
  if (a.out_dt != DType::kF32)
    return Unimplemented(where, ": the GEMM form's p v GEMM writes an f32 output, not ", DTypeName(a.out_dt));
  const bool rope = d.rope_q || d.rope_k;
  AttentionGemmKernels out;
  out.heads = d.b * d.h;
  out.qd_elements = out.heads * d.s * d.d, out.kd_elements = out.heads * d.d * d.sk, out.vd_elements = out.heads * d.sk * d.dv;
  out.scores_elements = out.heads * d.s * d.sk;

  CudaKernelSource& prep = out.prep;
  prep.num_elements = std::max({out.qd_elements, out.kd_elements, out.vd_elements});
  prep.scalar_work_items = prep.num_elements;
  prep.input_dtypes = {a.q_dt, a.k_dt, a.v_dt};
  if (rope) prep.input_dtypes.insert(prep.input_dtypes.end(), {a.cos_dt, a.sin_dt});
  prep.output_dtypes.assign(3, DType::kF32);
  std::string head = kDevicePrelude;
  head += "\n}  // namespace gf\n\n";
  head += StrCat("extern \"C\" __global__ void __launch_bounds__(", kCudaBlockSize, ") ");
  KernelSizes z;
  std::string t = HeadDims(a, z);
  t += "  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;\n";
  t += "  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;\n";
  // q: qd[bh][r][c].
  t += StrCat("  for (long long i = first; i < ", z.Use("kQd", out.qd_elements), "; i += step) {\n");
  t += "    const long long c = i % kD, r = i / kD % kS, bh = i / (kD * kS), h = bh % kH, b = bh / kH;\n";
  t += StrCat("    const ", StorageType(a.q_dt), "* qh = q + ", HeadRow(z, "q", a.qa, "h", "r"), ";\n");
  auto read_q = [&](const std::string& col) { return LoadF32(a.q_dt, StrCat("qh[", col, "]")); };
  if (d.rope_q) {
    t += RopedStore(a.cos_dt, a.sin_dt, read_q, a.cq, "r", "qd[i]", "    ", z, "cq");
  } else {
    t += StrCat("    qd[i] = ", read_q("c"), ";\n");
  }
  t += "  }\n";
  // k: kd[bh][j][c] = k_j[c] (roped).
  t += StrCat("  for (long long i = first; i < ", z.Use("kKd", out.kd_elements), "; i += step) {\n");
  t += "    const long long c = i % kD, j = i / kD % kSk, bh = i / (kD * kSk), h = bh % kH, b = bh / kH;\n";
  t += StrCat("    const ", StorageType(a.k_dt), "* kh = k + ", HeadRow(z, "k", a.ka, a.kvh, ""), ";\n");
  const std::string k_sr = z.Use("k_sr", a.ka.row_stride);
  auto kat = [&](const std::string& col) {
    return LoadF32(a.k_dt, a.kt ? StrCat("kh[(", col, ") * ", k_sr, " + j]") : StrCat("kh[j * ", k_sr, " + (", col, ")]"));
  };
  if (d.rope_k) {
    t += RopedStore(a.cos_dt, a.sin_dt, kat, a.ck, "j", "kd[i]", "    ", z, "ck", a.kvh);
  } else {
    t += StrCat("    kd[i] = ", kat("c"), ";\n");
  }
  t += "  }\n";
  // v: vd[bh][j][c].
  t += StrCat("  for (long long i = first; i < ", z.Use("kVd", out.vd_elements), "; i += step) {\n");
  t += "    const long long c = i % kDv, j = i / kDv % kSk, bh = i / (kDv * kSk), h = bh % kH, b = bh / kH;\n";
  t += StrCat("    vd[i] = ", LoadF32(a.v_dt, StrCat("v[", HeadRow(z, "v", a.va, a.kvh, "j"), " + c]")), ";\n  }\n}\n");
  t = StrCat("(", QkvParams(a, rope), ", float* __restrict__ qd, float* __restrict__ kd, float* __restrict__ vd",
             z.Parameter(), ") {\n", z.Declarations("  "), t);
  prep.sizes = z.values();
  prep = Finish(head, t, AttentionBaseName(d, "attention_prep"), a.q_dt, std::move(prep));

  CudaKernelSource& soft = out.softmax;
  soft.num_elements = out.scores_elements;
  soft.row_kernel = true;
  soft.scalar_work_items = out.heads * d.s;  // one block per score row
  if (d.mask) soft.input_dtypes.push_back(a.mask_dt);
  if (d.mask_select != 0) soft.input_dtypes.push_back(DType::kBool);
  soft.output_dtypes = {DType::kF32};
  head = kDevicePrelude;
  head += kRowPrelude;
  head += "\n}  // namespace gf\n\n";
  head += StrCat("extern \"C\" __global__ void __launch_bounds__(", kCudaBlockSize, ") ");
  KernelSizes zs;
  zs.Use("kS", d.s);
  zs.Use("kSk", d.sk);
  t = StrCat("  constexpr long long kH = ", d.h, "LL;\n");
  t += StrCat("  for (long long item = blockIdx.x; item < ", zs.Use("kItems", out.heads * d.s), "; item += gridDim.x) {\n");
  t += "    const long long r = item % kS, bh = item / kS, h = bh % kH, b = bh / kH;\n";
  t += "    (void)r, (void)h, (void)b;\n";
  t += "    float* row = p + item * kSk;\n";
  t += "    float m = -__int_as_float(0x7f800000);\n";
  t += StrCat("    for (long long j = threadIdx.x; j < kSk; j += ", kCudaBlockSize, ") {\n");
  t += ScoresToExponentials(a, "row", "row[j]", zs);
  t += RowSumAndInverse(a, "");
  t += StrCat("    for (long long j = threadIdx.x; j < kSk; j += ", kCudaBlockSize, ") row[j] = ",
              Weight(a, "row[j] * inv"), ";\n");
  t += "  }\n}\n";
  std::string params = "(";
  if (d.mask) params += ConstPtr(a.mask_dt, "mask") + ", ";
  if (d.mask_select != 0) params += "const unsigned char* __restrict__ bmask, ";
  t = StrCat(params, "float* __restrict__ p", zs.Parameter(), ") {\n", zs.Declarations("  "), t);
  soft.sizes = zs.values();
  soft = Finish(head, t, StrCat("attention_softmax", MaskSuffix(d), "_h", d.h), DType::kF32, std::move(soft));

  // cuBLAS's operands, per head bh = b * H + h (see codegen.h).
  out.s = d.s, out.sk = d.sk, out.d = d.d, out.dv = d.dv, out.b = d.b, out.h = d.h;
  out.out_head_stride_b = a.oa.head_stride_b, out.out_head_stride_h = a.oa.head_stride_h;
  out.out_row_stride = a.oa.row_stride;
  for (int i = 0; i < (d.mask ? 1 : 0) + (d.mask_select != 0 ? 1 : 0); ++i) out.mask_inputs.push_back(d.first_extra() + i);
  if (rope) out.rope_inputs = {d.num_inputs() - 2, d.num_inputs() - 1};
  return out;
}
}  // namespace graphfuse::cuda
