#include "cpu/elementwise_kernels.h"

#include <hwy/cache_control.h>

#include "cpu/op_rows.h"

namespace graphfuse::cpu {
namespace {

using namespace rows;  // the op table's rows as types (op_rows.h)

// How a kernel stores: kPlain; kStream, non-temporal stores (out 64-byte aligned) for outputs
// far larger than the caches; kPrefetch, plain stores with every operand prefetched 256 bytes
// ahead, for the caller's own arrays (in L2 rather than L1 when the call comes, so that the
// loads do not wait on L2).
enum class Mode { kPlain, kStream, kPrefetch };

template <class Row, Mode kMode>
void F32Kernel(const float* const* in, float* out, int64_t n, const OpAttrs& a, int64_t base) {
  using simd::VF;
  const float* x = in[0];
  const float* y = Row::kArity > 1 ? in[1] : in[0];
  const float* z = Row::kArity > 2 ? in[2] : in[0];
  constexpr int64_t kAhead = 64;  // floats
  for (int64_t i = 0; i < n; i += simd::kLanes) {
    if constexpr (kMode == Mode::kPrefetch) {
      hwy::Prefetch(x + i + kAhead);
      if constexpr (Row::kArity > 1) hwy::Prefetch(y + i + kAhead);
      if constexpr (Row::kArity > 2) hwy::Prefetch(z + i + kAhead);
      hwy::Prefetch(out + i + kAhead);
    }
    const VF vx = VF::Load(x + i);
    const VF vy = Row::kArity > 1 ? VF::Load(y + i) : vx;
    const VF vz = Row::kArity > 2 ? VF::Load(z + i) : vx;
    const VF r = Row::template Eval<VF, int64_t>(vx, vy, vz, a, base + i);
    if constexpr (kMode == Mode::kStream) r.Stream(out + i);
    else r.Store(out + i);
  }
}

template <class Row>
void F32ScaledKernel(const float* in, float* out, int64_t n, const OpAttrs& a, int64_t base, float c) {
  using simd::VF;
  const VF vc(c);
  for (int64_t i = 0; i < n; i += simd::kLanes) {
    const VF vx = VF::Load(in + i) * vc;
    (Row::template Eval<VF, int64_t>(vx, vx, vx, a, base + i) * vc).Store(out + i);
  }
}

template <class Row>
constexpr F32ScaledTileKernel ScaledOrNull() {
  if constexpr (Row::kArity == 1) return &F32ScaledKernel<Row>;
  return nullptr;
}

// Integer data: plain loops over int64 that the compiler vectorizes where it can.
template <class Row>
void I64Kernel(const int64_t* const* in, int64_t* out, int64_t n, const OpAttrs& a, int64_t base) {
  const int64_t* x = in[0];
  const int64_t* y = Row::kArity > 1 ? in[1] : in[0];
  const int64_t* z = Row::kArity > 2 ? in[2] : in[0];
  for (int64_t i = 0; i < n; ++i) out[i] = Row::template Eval<int64_t, int64_t>(x[i], y[i], z[i], a, base + i);
}

template <class Row>
constexpr I64TileKernel I64KernelOrNull() {
  if constexpr (Row::kInts) return &I64Kernel<Row>;
  return nullptr;
}

constexpr F32TileKernel kF32Kernels[] = {
#define OP(name, ...) &F32Kernel<name##Row, Mode::kPlain>,
#include "graphfuse/ops.def"
#undef OP
};
constexpr F32TileKernel kF32StreamKernels[] = {
#define OP(name, ...) &F32Kernel<name##Row, Mode::kStream>,
#include "graphfuse/ops.def"
#undef OP
};
constexpr F32TileKernel kF32PrefetchKernels[] = {
#define OP(name, ...) &F32Kernel<name##Row, Mode::kPrefetch>,
#include "graphfuse/ops.def"
#undef OP
};
constexpr F32ScaledTileKernel kF32ScaledKernels[] = {
#define OP(name, ...) ScaledOrNull<name##Row>(),
#include "graphfuse/ops.def"
#undef OP
};
constexpr I64TileKernel kI64Kernels[] = {
#define OP(name, ...) I64KernelOrNull<name##Row>(),
#include "graphfuse/ops.def"
#undef OP
};

}  // namespace

F32TileKernel GetF32TileKernel(OpKind kind) { return kF32Kernels[static_cast<size_t>(kind)]; }
F32TileKernel GetF32StreamKernel(OpKind kind) { return kF32StreamKernels[static_cast<size_t>(kind)]; }
F32TileKernel GetF32PrefetchKernel(OpKind kind) { return kF32PrefetchKernels[static_cast<size_t>(kind)]; }
F32ScaledTileKernel GetF32ScaledTileKernel(OpKind kind) { return kF32ScaledKernels[static_cast<size_t>(kind)]; }
I64TileKernel GetI64TileKernel(OpKind kind) { return kI64Kernels[static_cast<size_t>(kind)]; }
int VectorLanes() { return simd::kLanes; }
const char* SimdTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace graphfuse::cpu
