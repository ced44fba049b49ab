// CUDA C source for an elementwise group, generated from the op table.
//
// The body of a FusedElementwise node (a graph of op-table nodes over one iteration space)
// becomes ONE kernel: the device prelude (device_prelude.h: the vocabulary, written once),
// one __device__ function per op-table row the body uses -- the row's expression stringized
// by an X-macro over include/graphfuse/ops.def, so the generator has no per-op code -- and
//
//   __device__ void gf_body(idx, r0, r1, ..., &o0, ...)   // one line per node, f16/bf16
//                                                          // intermediates rounded as on the CPU
//   extern "C" __global__ void fused_add_mul_add_f32_1a2b3c4d(const float* in0, ..., float* out0)
//     fast path: every operand f32, n % 4 == 0, pointers 16-byte aligned (checked at run time):
//                float4 loads/stores, broadcast operands read once per 4 lanes
//     otherwise: grid-stride loop, broadcast indexing over the sizes
//
// Sizes are parameters, not constants: every generated kernel ends its parameters with
// `const gf::Sizes<N> z` (CudaKernelSource::sizes gives the values for the node at hand), and
// the source holds only what the shapes' pattern fixes (rank, which dims broadcast, the dtypes)
// and the sizes the weights fix where a generator says so (a norm's row length, head_dim). So
// the kernel for a group at a new sequence length is the same source, the same name and hash,
// and no new compilation. Launch with any grid (grid-stride loops), blockDim.x <=
// kCudaBlockSize; arguments are the inputs' then the outputs' device pointers, in body order,
// each dense row-major over its own shape, then the sizes by value.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "graphfuse/graph.h"

namespace graphfuse::cuda {

inline constexpr int kCudaBlockSize = 256;

struct CudaKernelSource {
  std::string name;    // the extern "C" kernel symbol: what it fuses, dtype, hash8
  std::string source;  // the whole translation unit, for NVRTC
  std::vector<DType> input_dtypes, output_dtypes;
  // The values of the kernel's last parameter, `const gf::Sizes<N> z` (N = sizes.size(); no
  // such parameter when empty): the sizes of this node's problem, which the source names.
  std::vector<int64_t> sizes;
  int64_t num_elements = 0;  // the iteration space
  bool has_vector_path = false;  // the float4 loop runs at these sizes (given aligned pointers)
  // Work items of the scalar loop (num_elements) and of the float4 loop (num_elements / 4):
  // a launcher sizes the grid from these (any grid is correct).
  int64_t scalar_work_items = 0, vector_work_items = 0;
  // A row kernel (codegen_rows.cc): launch exactly kCudaBlockSize threads per block; any
  // number of blocks (scalar_work_items = rows: one block per row is the natural grid).
  bool row_kernel = false;
};

// The kernel for a group body. `kernel_name` empty: "<prefix><ops>_<dtype>_<hash8>", the prefix
// "fused_" by default ("" for one-node bodies), hash8 = FNV-1a 32 of the source without the
// name: the same for every size of the body's shape class.
// Errors (a node outside the op table, mixed compute domains, constants in the body, a node
// not over the group's space) name the node at fault.
// row_strides[k] > 0: input k (of the group's shape) is read as rows of that many elements, a
// column block of a wider matrix (a GEMM epilogue reading one projection of a wider output).
Result<CudaKernelSource> GenerateElementwiseKernel(const Graph& body, const std::string& kernel_name = "",
                                                   const std::vector<int64_t>& row_strides = {},
                                                   const std::string& prefix = "");

// A one-node body for a single unfused op-table node (same input types and attributes).
Result<std::unique_ptr<Graph>> WrapSingleOpBody(const Node& node);

// The kernel for a node: a FusedElementwise node (its body, named by its source: the node's
// "kernel_name" hashes its sizes), a single op-table node, a row op (norms, softmax, their fused
// forms), Rope, or a FusedGemm's epilogue (below).
Result<CudaKernelSource> GenerateKernelForNode(const Node& node);

// ---- around the GEMMs (codegen_rows.cc) ----

// RMSNorm, LayerNormalization (optional mean / inv_std outputs), Softmax over the last axis,
// and FusedNorm / FusedSoftmax with their prologue / epilogue bodies: one block per row, the
// row in registers, statistics in double as on the CPU. Parameters: the node's inputs then
// its outputs, in node order.
Result<CudaKernelSource> GenerateRowKernel(const Node& node);
// FusedAttention (f32): one block per query row; parameters q, k, v, [mask], [cos, sin], out
// as the node's inputs and output. Rows of at most 8192 keys.
Result<CudaKernelSource> GenerateAttentionKernel(const Node& node);
// FusedAttention as GEMMs, for many query rows per head (prefill), where the one-kernel form
// would read each head's K and V once per query row:
//   prep     (q, k, v, [cos, sin], qd, kd, vd): dense per-head scratch, bh = b * H + h:
//            qd [BH, S, d] (q roped), kd [BH, Sk, d] (k roped), vd [BH, Sk, dv];
//   cuBLAS   scores [BH, S, Sk] = qd kd^T, strided-batched over bh;
//   softmax  ([mask], [bool mask], scores): in place, row by row: scale, masks, softmax (the
//            one-kernel form's arithmetic; sum in double);
//   cuBLAS   out = scores vd, each head's rows stored into the output's layout.
struct AttentionGemmKernels {
  CudaKernelSource prep, softmax;
  int64_t b = 0, h = 0, heads = 0, s = 0, sk = 0, d = 0, dv = 0;
  int64_t qd_elements = 0, kd_elements = 0, vd_elements = 0, scores_elements = 0;
  // Where head (b, h) of the output starts, and its row stride (columns are contiguous).
  int64_t out_head_stride_b = 0, out_head_stride_h = 0, out_row_stride = 0;
  std::vector<int> mask_inputs, rope_inputs;  // node input indices: the softmax's, the prep's cos / sin
};
Result<AttentionGemmKernels> GenerateAttentionGemmKernels(const Node& node);
// FusedCachedAttention at decode, flash-decoding style (codegen_decode.cc): the keys of each
// (batch, KV head) split across blocks so that every multiprocessor has work at batch 1.
//   split    (q, k_new, v_new, past_k, past_v, [mask], [bool mask], [cos, sin], present_k,
//            present_v, part): one block per (batch, KV head, split of `chunk` keys) for the
//            KV head's `rows` = (heads / kv_heads) * seq_q query rows; writes the present rows
//            of its keys and each row's partial softmax to part: per (batch, KV head, split,
//            row) dv + 2 floats: the chunk's max score m, sum l of exp(s - m), and
//            acc = sum exp(s - m) v;
//   combine  (part, out): one block per (batch, head, query row) folds the splits' partials.
// With DecodeSplitOptions::one_launch (the default) the split kernel also takes (tickets, out)
// and its last block per (batch, KV head) does the combine: one launch, no combine kernel.
struct DecodeSplitOptions {
  int sms = 132;  // the device's multiprocessors (an H200's without a device)
  // Fewer keys than this per split are not worth a block of their own.
  int64_t min_keys_per_split = 32;
  // One kernel: the last split of each (batch, KV head) combines (its parameters end with
  // `tickets`, one zeroed int per batch x KV head that the kernel leaves zeroed, and the
  // output); off: the split kernel, then the combine kernel.
  bool one_launch = true;
};
struct DecodeAttentionKernels {
  CudaKernelSource split, combine;  // combine: empty with one_launch
  int64_t splits = 0, chunk = 0, rows = 0;
  int64_t partial_elements = 0;  // floats of part
  int64_t tickets = 0;           // int counters (one_launch)
};
Result<DecodeAttentionKernels> GenerateDecodeAttentionKernels(const Node& node, const DecodeSplitOptions& options = {});

// FusedAttention as one flash-style kernel for many query rows per head (codegen_flash.cc): a
// thread block per tile of query rows of one head, K / V tiles staged in shared memory, an
// online softmax, the output accumulated in registers; no scores in memory. Parameters as
// GenerateAttentionKernel's; launch kCudaBlockSize threads per block, any grid. Named
// "flash_attention_..._br<rows>_bc<keys>[_causal]_<dtype>_<hash8>" (_causal: key tiles a
// constant causal mask drops are left out). Unimplemented for heads wider than 256 and empty
// problems.
Result<CudaKernelSource> GenerateFlashAttentionKernel(const Node& node);
// Transpose (any dtype): parameters x, y.
Result<CudaKernelSource> GenerateTransposeKernel(const Node& node);
// Rope (rotate-half): parameters x, cos, sin, y.
Result<CudaKernelSource> GenerateRopeKernel(const Node& node);
// A FusedGemm's epilogue as one elementwise kernel run right after the GEMM. Parameters: the
// S projections (each a pointer to its first column; a projection that is a node output has
// rows of N elements, the others are read from the [M, S*N] GEMM workspace), the node's extra
// inputs, then the epilogue's outputs.
Result<CudaKernelSource> GenerateGemmEpilogueKernel(const Node& node);

// ---- how each node runs: the CUDA kernel registry (kernel_registry.cc) ----

// Whether one cuBLASLt call computes a FusedGemm's epilogue exactly: no epilogue, bias,
// ReLU(+bias), or GELU-tanh(+bias) (cuBLASLt's GELU is the tanh form; an erf Gelu is never
// mapped onto it), for one projection whose only output is the epilogue's; or a residual added
// to the product, alone or after a bias (out = p + r, out = (p + bias) + r, either operand
// order of each Add; r of the output's shape and dtype), which cuBLASLt adds as its C operand
// with beta = 1 (D = A W + bias + C, C and D distinct). The bias is of the output's dtype
// (cuBLASLt's bias type for f32, f16 and bf16 outputs).
struct CublasLtEpilogue {
  enum Kind { kNotCovered, kNone, kBias, kReluBias, kGeluTanhBias } kind = kNotCovered;
  int64_t bias_input = -1;      // the node input holding the [N] bias
  int64_t residual_input = -1;  // the node input added as C (kNone or kBias only)
};
CublasLtEpilogue CublasLtEpilogueFor(const Node& fused_gemm);

// How one node of a plan runs on the GPU, with the kernels to compile for it.
enum class CudaPath {
  kView,             // Reshape and kin: a view of the input buffer, no launch
  kCublas,           // MatMul / Gemm / FusedGemm covered by cuBLAS(Lt) alone
  kCublasThenKernel, // FusedGemm: cuBLAS GEMM, then its generated epilogue kernel
  kKernel,           // one generated kernel
  kAttentionGemms,   // FusedAttention with many query rows: 2 generated kernels around 2 cuBLAS calls
  kDecodeAttention,  // FusedCachedAttention at decode: the split kernel, then the combine kernel
};
// How a FusedAttention with more query rows per head than attention_rows_one_kernel runs.
enum class PrefillAttention {
  kFlash,  // one flash-style kernel (GenerateFlashAttentionKernel); the GEMM form where it is refused
  kGemms,  // the GEMM form (GenerateAttentionGemmKernels)
};
struct CudaNodePlan {
  CudaPath path = CudaPath::kKernel;
  std::string what;  // for reports: "generated row kernel", "cuBLASLt GEMM with its epilogue", ...
  CublasLtEpilogue cublas_epilogue;
  std::vector<CudaKernelSource> kernels;
  AttentionGemmKernels attention;  // kAttentionGemms: the kernels (also in `kernels`) and operands
  DecodeAttentionKernels decode;   // kDecodeAttention: the kernels (also in `kernels`) and the scratch
};
struct CudaPlanOptions {
  // A FusedAttention with at most this many query rows per head (decode: 1) runs as one
  // generated kernel with a block per row; with more, as prefill_attention says.
  int64_t attention_rows_one_kernel = 16;
  // A FusedCachedAttention with at most attention_rows_one_kernel query rows per head runs as
  // the decode kernels, split as these say (CudaExecutor sets sms from the device); with more,
  // its reference graph runs.
  DecodeSplitOptions decode;
  PrefillAttention prefill_attention = PrefillAttention::kFlash;
  // f32 GEMMs (cuBLAS and cuBLASLt) with CUBLAS_COMPUTE_32F_FAST_TF32: A and B rounded to TF32's
  // 10-bit mantissa on the tensor cores (about 1e-3 relative error per product); emulated plans
  // round them so on the host. f16 / bf16 GEMMs are unaffected.
  bool tf32 = false;
};
// "flash" / "gemms" (as tools/run's --cuda-attention takes them).
Result<PrefillAttention> ParsePrefillAttention(const std::string& name);
// Errors name the node and say what is missing (Unimplemented for ops with no CUDA path yet).
Result<CudaNodePlan> PlanNodeForCuda(const Node& node, const CudaPlanOptions& options = {});

// Every node of g with its plan, in the order CudaExecutor plans them: a node without a path of
// its own that has a reference graph (the projected attention) is seen with its failed plan,
// then that graph's nodes one level deeper; any other failure is seen as it is. Stops at the
// first error `visit` returns.
Status ForEachCudaPlan(const Graph& g,
                       const std::function<Status(const Node&, Result<CudaNodePlan>& plan, int depth)>& visit,
                       const CudaPlanOptions& options = {}, int depth = 0);


}  // namespace graphfuse::cuda
