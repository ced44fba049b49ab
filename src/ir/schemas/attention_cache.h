// FusedCachedAttention: a FusedAttention over a KV cache that appends the new K / V rows to the
// past ones itself. Shared by the op's inference (attention_cache.cc), the FuseAttentionCache
// pass (src/passes/fuse_attention_cache.cc) and the CPU kernel
// (src/cpu/kernels/attention_cache.cc).
//
//   inputs:  q, k_new, v_new, past_k [B,KV,P,d], past_v [B,KV,P,dv], then the attention's
//            extras (mask, bool mask, cos, sin) as FusedAttention orders them
//   outputs: the attention's output, present_k [B,KV,P+N,d], present_v [B,KV,P+N,dv]
//
// present_k is past_k's rows then k_new's N rows (each roped with cos / sin, broadcast to
// [B,KV,N,d], when rope_new_k), present_v likewise without RoPE; the attention is then the
// FusedAttention its attributes describe (k and v bhsd, seq_k = P+N, no RoPE of K) with present_k
// and present_v as its k and v. k_new / v_new are read in new_k_layout / new_v_layout: "bhsd"
// ([B,KV,N,d]) or "bshd" (the pre-head-split [B,N,KV*d], any shape with that order).
#pragma once

#include <span>
#include <string>

#include "ir/schemas/attention_layout.h"

namespace graphfuse::schemas {

struct CacheDims {
  Dims att;  // the attention over the present rows
  int64_t past = 0, rows = 0;  // P and N: seq_k = P + N
  Layout new_k = Layout::kBHSD, new_v = Layout::kBHSD;
  bool rope_new_k = false;
  static constexpr int kFirstExtra = 5;  // the attention's extras follow q, k_new, v_new, past_k, past_v
};

Result<CacheDims> ReadCacheDims(const AttributeMap& a, const std::string& where);

// Checks q, k_new, v_new, the past rows and the attention's extras (dtypes and shapes, in input
// order); inference and the kernel check alike. Errors name `where`.
Status CheckCacheOperands(const CacheDims& c, std::span<const DType> dtypes, std::span<const Shape> shapes,
                          const std::string& where, AttentionDTypes accept = AttentionDTypes::kF32);

// The present K / V shapes: [B,KV,P+N,d] and [B,KV,P+N,dv].
Shape PresentShape(const CacheDims& c, bool v);

}  // namespace graphfuse::schemas
