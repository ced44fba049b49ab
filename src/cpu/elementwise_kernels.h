// Per-op tile kernels, generated from the op table: the building blocks that the tile
// executor runs one after another over an L1-resident tile (one op = a one-instruction program).
#pragma once

#include <cstdint>

#include "graphfuse/ops.h"

namespace graphfuse::cpu {

// The two register domains of a tile: float data computes in f32 lanes, integer and bool data
// in int64 (exact). f16/bf16 load into and store from the f32 domain.
enum class Domain : uint8_t { kF32, kI64 };

inline Domain DomainOf(DType t) { return IsFloat(t) ? Domain::kF32 : Domain::kI64; }

// out[i] = op(in[0][i], in[1][i], in[2][i]) for i in [0, n); n is a multiple of VectorLanes().
// `base` is the global element index of in[*][0] (Dropout's RNG counter).
using F32TileKernel = void (*)(const float* const* in, float* out, int64_t n, const OpAttrs& a, int64_t base);
using I64TileKernel = void (*)(const int64_t* const* in, int64_t* out, int64_t n, const OpAttrs& a,
                               int64_t base);

F32TileKernel GetF32TileKernel(OpKind kind);
// The same kernel with non-temporal stores: `out` must be 64-byte aligned, and the caller
// fences (hwy::FlushStream) before another thread reads the result.
F32TileKernel GetF32StreamKernel(OpKind kind);
// The same kernel prefetching its operands ahead: for arrays outside the tile's L1 registers.
F32TileKernel GetF32PrefetchKernel(OpKind kind);
// out[i] = c * op(c * in[0][i]), each product rounded (what Mul, op, Mul give), in one pass:
// a unary op between two scalings by c (a folded RMSNorm's 1/rms around a GEMM's gate, the
// FusedGemm gated form). Unary ops only (arity 1); n a multiple of VectorLanes().
using F32ScaledTileKernel = void (*)(const float* in, float* out, int64_t n, const OpAttrs& a, int64_t base,
                                     float c);
F32ScaledTileKernel GetF32ScaledTileKernel(OpKind kind);
// nullptr when the op has no integer form.
I64TileKernel GetI64TileKernel(OpKind kind);

// f32 lanes per vector of the build's SIMD target.
int VectorLanes();
// The SIMD target the kernels were compiled for ("AVX3_DL", "AVX2", ...).
const char* SimdTargetName();

}  // namespace graphfuse::cpu
