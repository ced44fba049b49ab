#include <cmath>
#include <string>

#include "graphfuse/ops.h"

namespace graphfuse {
namespace {

constexpr bool kIntOk = true;
constexpr bool kFloatOnly = false;
using enum OpClass;

constexpr OpInfo kOps[] = {
#define OP(name, arity, cls, ints, cost, ulp, alpha, beta, expr) \
  {OpKind::k##name, #name, arity, cls, ints, cost, ulp, alpha, beta, #expr},
#include "graphfuse/ops.def"
#undef OP
};

std::string DTypeList(std::span<const DType> ts) {
  std::string s;
  for (DType t : ts) s += std::string(s.empty() ? "" : ", ") + DTypeName(t);
  return s;
}

}  // namespace

std::span<const OpInfo> AllOps() { return kOps; }

const OpInfo& GetOpInfo(OpKind kind) {
  auto i = static_cast<size_t>(kind);
  GF_CHECK(i < std::size(kOps), "bad OpKind ", i);
  return kOps[i];
}

Result<OpKind> OpFromName(std::string_view name) {
  for (const OpInfo& op : kOps)
    if (name == op.name) return op.kind;
  return NotFound("unknown elementwise op '", name, "'");
}

OpAttrs DefaultAttrs(OpKind kind) {
  const OpInfo& info = GetOpInfo(kind);
  OpAttrs a;
  a.alpha = info.default_alpha;
  a.beta = info.default_beta;
  return a;
}

Result<DType> InferDType(OpKind kind, std::span<const DType> in, const OpAttrs& attrs) {
  const OpInfo& op = GetOpInfo(kind);
  auto fail = [&](const std::string& why) {
    return InvalidArgument("op ", op.name, " with input dtypes (", DTypeList(in), "): ", why);
  };
  if (static_cast<int>(in.size()) != op.arity)
    return InvalidArgument("op ", op.name, " takes ", op.arity, " input(s), got ", in.size());
  // The data inputs: all but Where's condition.
  std::span<const DType> data = op.cls == kSelect ? in.subspan(1) : in;
  for (DType t : data)
    if (t != data[0]) return fail("inputs must share one dtype");
  const DType t = data[0];
  if (op.cls == kSelect && in[0] != DType::kBool) return fail("the condition must be bool");
  if (op.cls == kLogical) {
    if (t != DType::kBool) return fail("inputs must be bool");
    return DType::kBool;
  }
  if (op.cls == kCast) return attrs.to;
  if (!IsFloat(t) && !op.int_ok) return fail("defined on f32, f16 and bf16 only");
  if (t == DType::kBool && op.cls != kCompare && op.cls != kSelect)
    return fail("arithmetic on bool is not defined; Cast it first");
  if (op.cls == kCompare) return DType::kBool;
  return t;
}

Result<Shape> InferShape(OpKind kind, std::span<const Shape> in) {
  const OpInfo& op = GetOpInfo(kind);
  if (static_cast<int>(in.size()) != op.arity)
    return InvalidArgument("op ", op.name, " takes ", op.arity, " input(s), got ", in.size());
  if (kind == OpKind::kBias) {
    const Shape& x = in[0];
    const Shape& b = in[1];
    if (x.empty() || b.size() != 1 || b[0] != x.back())
      return InvalidArgument("op Bias needs a 1-D bias [C] matching the last dim of x; got x ",
                             ShapeToString(x), " and bias ", ShapeToString(b));
  }
  auto out = BroadcastShapes(in);
  if (!out.ok()) return out.status().WithContext(StrCat("op ", op.name));
  return out;
}

Status CheckAttrs(OpKind kind, const OpAttrs& a) {
  switch (kind) {
    case OpKind::kDropout:
      if (!(a.alpha >= 0.f && a.alpha < 1.f))
        return InvalidArgument("op Dropout: ratio must be in [0, 1), got ", a.alpha);
      break;
    case OpKind::kClip:
      if (std::isnan(a.alpha) || std::isnan(a.beta) || a.alpha > a.beta)
        return InvalidArgument("op Clip: needs min <= max, got min ", a.alpha, " max ", a.beta);
      break;
    default: break;
  }
  return Status::Ok();
}

}  // namespace graphfuse
