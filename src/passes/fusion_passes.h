// The fusion passes beyond elementwise groups, in pipeline order (see pipeline.h). Each
// takes the plan's FusionReport and keeps it true: groups it forms are added (kind
// "attention", "gemm_epilogue", "norm", "softmax"), elementwise groups it absorbs are removed
// from the report and their member nodes listed in the new group, every refusal is recorded.
// Each new fused node carries a "reference" graph attribute: the original ops, with inputs and
// outputs matching the node's one to one, which `graphfuse run --check-fusion` runs on the
// same inputs. With options.enabled == false each pass changes nothing.
#pragma once

#include "passes/fuse_elementwise.h"
#include "graphfuse/graph.h"

namespace graphfuse {

// Recognizes what exporters write out as primitive ops -- LayerNorm, RMSNorm, GELU (erf and
// tanh forms), SiLU, Softmax, RoPE's rotate-half -- and replaces each with the op it is; a
// linear layer written as Gemm with constant weights becomes MatMul + bias Add (for FuseGemm).
// Returns the number of patterns rewritten. (canonicalize.cc)
Result<int> Canonicalize(Graph& g);

// Views and slices between a GEMM and its readers: a view (Reshape, Flatten, Squeeze,
// Unsqueeze, Identity) that keeps the innermost dim moves above a row-wise producer (a MatMul
// by 2-D weights, an elementwise op whose other operands broadcast along the last dim), views
// of views become one and views to their input's shape go away; Slice / Split of contiguous
// last-dim ranges of a constant-weight projection (+ bias) become projections of their own.
// Returns the number of rewrites. (canonicalize_views.cc)
Result<int> CanonicalizeViews(Graph& g);

// MatMul(Q, K^T) [* or / scale] [+ mask] -> Softmax -> MatMul(., V), with Q/K/V read through
// their head-split Reshape/Transpose (and RoPE) as one FusedAttention kernel. (fuse_attention.cc)
Result<int> FuseAttention(Graph& g, const FusionOptions& options, FusionReport* report);

// A FusedAttention whose k and v are Concat(past, new rows) of a KV cache takes the append in
// (the new rows' head split and K's RoPE too): one FusedCachedAttention that also writes the
// present K / V rows. (fuse_attention_cache.cc)
Result<int> FuseAttentionCache(Graph& g, const FusionOptions& options, FusionReport* report);

// MatMuls with constant weights: projections of the same input become one GEMM over
// concatenated weights (horizontal) and the elementwise group that consumes the results runs
// as the GEMM's epilogue, in the same kernel. (fuse_gemm.cc)
Result<int> FuseGemm(Graph& g, const FusionOptions& options, FusionReport* report);
// A FusedAttention whose q, k, v are the three outputs of one FusedGemm (and nothing else's),
// or of separate GEMMs of one x (grouped-query attention's q and k / v), takes the GEMMs in: it
// reads x and W, and projects each head in its own task. (fuse_attention_projections.cc)
Result<int> FuseAttentionProjections(Graph& g, const FusionOptions& options, FusionReport* report);

// An RMSNorm between two FusedGemms (the first writes its input, the second reads its output as
// A) runs inside them: the first also writes each row's 1/rms, the second's weights take the
// norm's scale and its projections are scaled per row; one read only by a projected attention
// runs inside the attention. Only with options.norm_into_gemm.
// (fold_norm.cc)
Result<int> FoldNormIntoGemm(Graph& g, const FusionOptions& options, FusionReport* report);

// An elementwise group feeding RMSNorm / LayerNormalization (prologue, e.g. the residual
// add, optionally also emitting its result) or around a Softmax (prologue: scale, mask;
// epilogue: dropout mask) runs inside the row kernel. (fuse_rowwise.cc)
Result<int> FuseRowwise(Graph& g, const FusionOptions& options, FusionReport* report);

// LayerNormalizations of one input (a parallel block's attention and MLP norms) with the same
// axis and epsilon become one FusedLayerNorms: the input read once, each row's statistics
// computed once. Returns the number of fused nodes formed. (fuse_sibling_norms.cc)
Result<int> FuseSiblingNorms(Graph& g, const FusionOptions& options, FusionReport* report);

}  // namespace graphfuse
