// How a FusedGemm node's epilogue runs: pattern matching on its epilogue graph (as FuseGemm
// builds it, fuse_gemm.cc) for the forms a GEMM applies as it stores, or block by block while
// the block is in cache, instead of a pass over whole rows after the GEMMs. The CPU kernel
// (src/cpu/kernels/fused_gemm.cc) runs the form recognized here and the fusion report names it
// (FusedGemmEpilogueForm), so that the plan and its description agree. In every form the bits
// are those of the epilogue's ops run one by one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/schemas/fused_gemm.h"
#include "graphfuse/graph.h"
#include "graphfuse/ops.h"

namespace graphfuse {
namespace gemm_epilogue {

// A unary op of the table that does not depend on the element index (Silu, Gelu, Relu, ...):
// what the gated and bias-activation forms run in place on a block with the op's tile kernel.
struct BlockUnary {
  OpKind kind{};
  OpAttrs attrs;
};

// The gated form of the epilogue: two projections and the epilogue is exactly
// out = U(p_act) * p_mul (either operand order of the Mul), U one unary op of the table that does
// not depend on the element index (Silu for SwiGLU, Gelu for GeGLU, ...). With packed weights a
// block of columns then runs as three steps on the calling thread: p_act's GEMM into the
// workspace, U in place over that block while it is in L2, and p_mul's GEMM multiplying by it as
// it stores into the output (a Mul post-op, PackedGemm::PostOp). p_mul never exists apart from the output,
// no pass over whole rows follows the GEMMs, and the bits are those of MatMul, U and Mul run
// one by one (the same packed blocks, the same tile kernel of U).
struct GatedEpilogue {
  int64_t act = 0, mul = 1;  // projection indices
  BlockUnary u;
};

// The bias-activation form of the epilogue: one projection, and the epilogue is exactly
// out = U(p + bias), U(p) or p + bias, with U one unary op of the table that does not depend on
// the element index (GPT-2's and BERT's first MLP projection: bias, then GELU) and bias an extra
// input of N values along the output's last dim. With packed weights the GEMM then writes the
// node's output, adding the bias as it stores (the matmul's bias), and each block is finished
// in place right after its GEMM, row piece by row piece while it is in L1 / L2, by U's tile
// kernel (where oneDNN would not take the bias, the block adds it first). It reads and writes
// only the block just computed (as the gated form), and the bits are those of MatMul, Add and
// U run one by one. (p + bias alone is a store chain.)
struct BiasActEpilogue {
  int64_t bias_input = -1;  // the node input holding the bias, or -1
  std::optional<BlockUnary> u;
};

// The store-chain form of the epilogue: each output is one projection with extra inputs added
// to it one Add after another (either operand order of each), every one a residual (the
// output's shape) or a bias (N values along the last dim, first only): out = ((p_s + x_1) + x_2) ...
// GPT-2's and BERT's Q, K and V biases, their bias and residual after the attention and after
// the MLP, LLaMA's residual adds. With packed weights the GEMM applies the adds as it stores each
// block (PackedGemm's post-ops) straight into the outputs: no workspace and no pass over the
// product, and the bits are those of MatMul and the Adds run one by one.
struct StoreChain {
  struct Link {
    int64_t input = 0;  // the node input added
    bool row = false;   // a bias broadcast over the rows, else of the output's shape
  };
  std::vector<int64_t> output;           // per projection: the node output it becomes
  std::vector<std::vector<Link>> links;  // per projection: its adds, in order
};

// The form a node's epilogue takes with packed weights, at most one of the three: the gated
// form, else a store chain, else the bias-activation form (PrepareFusedGemm packs for it, and
// FusedGemmEpilogueForm names it).
struct PackedForm {
  std::optional<GatedEpilogue> gate;
  std::optional<StoreChain> chain;
  std::optional<BiasActEpilogue> bias_act;
};

// The packed form of a FusedGemm node of geometry g (schemas::Geometry).
// With a row_scale only the gated form: the others add to the product as it is stored, before
// it could be scaled.
PackedForm PackedFormOf(const Node& node, const schemas::GemmGeometry& g);

// The bias-activation form alone (what runs when the packing for the post-ops is refused).
std::optional<BiasActEpilogue> BiasActForm(const Node& node, const schemas::GemmGeometry& g);

// The residual form of the epilogue: one projection, and the epilogue is exactly
// out = projection + r with r an extra input of the output's shape (either operand order).
// Without packed weights r is first copied into the output and sgemm accumulates onto it
// (beta = 1); neither a workspace nor a pass over the product exists (packed, it is a store
// chain of one add). Returns r's node input index, or -1.
int64_t ResidualInput(const Node& node, const schemas::GemmGeometry& g);

}  // namespace gemm_epilogue

// How a FusedGemm node's epilogue runs on the CPU, in words: added as the GEMM stores (a store
// chain of biases and residuals), finished per block while the block is in L2 (the gated and
// bias-activation forms), or a pass over whole rows after the GEMMs. The forms that need packed
// weights apply when the weights are constant; the words describe the plan, and a packing oneDNN
// refuses at run time falls back to the pass. Empty for a node without an epilogue.
std::string FusedGemmEpilogueForm(const Node& node);

}  // namespace graphfuse
