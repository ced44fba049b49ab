// CUDA C source for an elementwise group, generated from the op table.
//
// The body of a FusedElementwise node (a graph of op-table nodes over one iteration space)
// becomes ONE kernel: the device prelude (device_prelude.h: the vocabulary, written once),
// one __device__ function per op-table row the body uses -- the row's expression stringized
// by an X-macro over src/ops/ops.def, so the generator has no per-op code -- and
//
//   __device__ void gf_body(idx, r0, r1, ..., &o0, ...)   // one line per node, f16/bf16
//                                                          // intermediates rounded as on the CPU
//   extern "C" __global__ void fused_add_mul_add_f32_1a2b3c4d(const float* in0, ..., float* out0)
//     fast path: every operand f32, n % 4 == 0, pointers 16-byte aligned (checked at run time):
//                float4 loads/stores, broadcast operands read once per 4 lanes
//     otherwise: grid-stride loop, broadcast indexing with the shapes baked in as constants
//
// Static shapes are baked into the source: a kernel serves one group at one shape. Launch
// with any grid (grid-stride loops), blockDim.x <= kCudaBlockSize; arguments are the inputs'
// then the outputs' device pointers, in body order, each dense row-major over its own shape.
#pragma once

#include <string>
#include <vector>

#include "graphfuse/graph.h"

namespace graphfuse::cuda {

inline constexpr int kCudaBlockSize = 256;

struct CudaKernelSource {
  std::string name;    // the extern "C" kernel symbol: what it fuses, dtype, hash8
  std::string source;  // the whole translation unit, for NVRTC
  std::vector<DType> input_dtypes, output_dtypes;
  int64_t num_elements = 0;  // the iteration space
  bool has_vector_path = false;
  // Work items of the scalar loop (num_elements) and of the float4 loop (num_elements / 4):
  // a launcher sizes the grid from these (any grid is correct).
  int64_t scalar_work_items = 0, vector_work_items = 0;
};

// The kernel for a group body. `kernel_name` empty: "fused_<ops>_<dtype>_<hash8>" (one-node
// bodies: "<op>_<dtype>_<hash8>"), hash8 = FNV-1a 32 of the source without the name.
// Errors (a node outside the op table, mixed compute domains, constants in the body, a node
// not over the group's space) name the node at fault.
// row_strides[k] > 0: input k (of the group's shape) is read as rows of that many elements, a
// column block of a wider matrix (a GEMM epilogue reading one projection of a wider output).
Result<CudaKernelSource> GenerateElementwiseKernel(const Graph& body, const std::string& kernel_name = "",
                                                   const std::vector<int64_t>& row_strides = {});

// A one-node body for a single unfused op-table node (same input types and attributes).
Result<std::unique_ptr<Graph>> WrapSingleOpBody(const Node& node);

// The kernel for a node: a FusedElementwise node (its body; its "kernel_name" attribute if
// present) or a single op-table node.
Result<CudaKernelSource> GenerateKernelForNode(const Node& node);

// FNV-1a 32-bit (kernel-name hashes).
uint32_t Fnv1a32(const std::string& s);

}  // namespace graphfuse::cuda
