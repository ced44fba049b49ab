// Rope: rotary position embedding in rotate-half form (the LLaMA / GPT-NeoX convention),
//   Y = X * cos + rotate_half(X) * sin,
//   rotate_half(X)[..., i] = -X[..., i + d/2]  for i <  d/2,
//                             X[..., i - d/2]  for i >= d/2,
// over the last dim d of X (even). cos and sin have X's dtype and broadcast unidirectionally to
// X's shape (typically [S, d] or [1, 1, S, d] against X [B, H, S, d]). Inference; the CPU kernel
// is in src/cpu/kernels/rope.cc.
#include "infer_util.h"
#include "schema_lists.h"

namespace graphfuse::schemas {
namespace {

Result<std::vector<ValueType>> InferRope(const InferContext& ctx) {
  const Value* x = ctx.input(0);
  const Value* cos = ctx.input(1);
  const Value* sin = ctx.input(2);
  if (x == nullptr || cos == nullptr || sin == nullptr)
    return InvalidArgument(ctx.Describe(), ": Rope needs three inputs (x, cos, sin)");
  if (!IsFloat(x->dtype()))
    return InvalidArgument(ctx.Describe(), ": Rope needs a float input, got ", DTypeName(x->dtype()));
  const Shape& xs = x->shape();
  if (xs.empty()) return InvalidArgument(ctx.Describe(), ": Rope needs an input of rank >= 1, got a scalar");
  if (xs.back() % 2 != 0)
    return InvalidArgument(ctx.Describe(), ": Rope rotates halves of the last dim, which must be even; x is ",
                           TypeStr(x));
  for (const Value* t : {cos, sin}) {
    const char* what = t == cos ? "cos" : "sin";
    if (t->dtype() != x->dtype())
      return InvalidArgument(ctx.Describe(), ": ", what, " must have x's dtype ", DTypeName(x->dtype()), ", got ",
                             DTypeName(t->dtype()));
    if (!BroadcastsTo(t->shape(), xs))
      return InvalidArgument(ctx.Describe(), ": ", what, " ", ShapeToString(t->shape()),
                             " does not broadcast to x's shape ", ShapeToString(xs));
  }
  return std::vector<ValueType>{{x->dtype(), xs}};
}

}  // namespace

std::vector<OpSchema> RopeSchemas() {
  return {
      {"Rope", 3, 3, 1, InferRope},
  };
}

}  // namespace graphfuse::schemas
