// The op table's rows as types: each row becomes a struct whose Eval is the row's expression
// for any T (simd::VF in the SIMD kernels, int64_t for integer data). Shared by the tile
// kernels (elementwise_kernels.cc) and by the CPU code generator's generated sources
// (cpu_codegen.cc), so that both compute every op with the very same instructions.
#pragma once

#include "ops/scalar_math.h"
#include "cpu/simd.h"

namespace graphfuse::cpu::rows {

inline constexpr bool kIntOk = true, kFloatOnly = false;

#define OP(name, arity, cls, ints, cost, ulp, alpha, beta, expr)                                 \
  struct name##Row {                                                                            \
    static constexpr int kArity = arity;                                                        \
    static constexpr bool kInts = ints;                                                         \
    template <class T, class I>                                                                 \
    static T Eval([[maybe_unused]] T x, [[maybe_unused]] T y, [[maybe_unused]] T z,             \
                  [[maybe_unused]] const OpAttrs& a, [[maybe_unused]] I idx) {                  \
      using namespace ::graphfuse::simd;                                                        \
      using namespace ::graphfuse::scalar;                                                      \
      return expr;                                                                              \
    }                                                                                           \
  };
#include "graphfuse/ops.def"
#undef OP

}  // namespace graphfuse::cpu::rows
