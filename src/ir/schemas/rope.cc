// Rope: rotary position embedding in rotate-half form (the LLaMA / GPT-NeoX convention),
//   Y = X * cos + rotate_half(X) * sin,
//   rotate_half(X)[..., i] = -X[..., i + d/2]  for i <  d/2,
//                             X[..., i - d/2]  for i >= d/2,
// over the last dim d of X (even). cos and sin have X's dtype and broadcast unidirectionally to
// X's shape (typically [S, d] or [1, 1, S, d] against X [B, H, S, d]). Inference; the CPU kernel
// is in src/cpu/kernels/rope.cc. With rotary_dim = r (0 < r < d, even), only the first r
// values of each row rotate, halves of r, with tables of r values ([.., r], broadcasting to
// x's shape with r for d); the other d - r pass through (GPT-NeoX's and Phi's partial rotary).
// interleaved = 1: the rotated pairs are (x[2i], x[2i+1]) instead of (x[i], x[i + r/2]), as
// GPT-J's rotate_every_two writes them, the tables [.., r] holding each angle twice.
#include "ir/schemas/infer_util.h"
#include "ir/schemas/schema_lists.h"

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
  const int64_t r = ctx.GetInt("rotary_dim", 0) > 0 ? ctx.GetInt("rotary_dim", 0) : xs.back();
  if (r % 2 != 0 || r > xs.back())
    return InvalidArgument(ctx.Describe(), ": Rope rotates halves of the first ", r, " values of the last dim (",
                           "rotary_dim), which must be even and at most the dim; x is ", TypeStr(x));
  Shape rotated = xs;
  rotated.back() = r;
  for (const Value* t : {cos, sin}) {
    const char* what = t == cos ? "cos" : "sin";
    if (t->dtype() != x->dtype())
      return InvalidArgument(ctx.Describe(), ": ", what, " must have x's dtype ", DTypeName(x->dtype()), ", got ",
                             DTypeName(t->dtype()));
    if (!BroadcastsTo(t->shape(), rotated))
      return InvalidArgument(ctx.Describe(), ": ", what, " ", ShapeToString(t->shape()),
                             " does not broadcast to the rotated shape ", ShapeToString(rotated));
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
