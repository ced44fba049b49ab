// Registry entries for the op table's rows: inference from ops.h's rules.
#include <array>

#include "ir/op_registry.h"

namespace graphfuse {

OpAttrs ElementwiseAttrs(OpKind kind, const AttributeMap& attrs) {
  OpAttrs a = DefaultAttrs(kind);
  auto num = [&](const char* k, float def) {
    auto it = attrs.find(k);
    if (it == attrs.end()) return def;
    if (auto* f = std::get_if<float>(&it->second)) return *f;
    if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<float>(*i);
    return def;
  };
  auto integer = [&](const char* k, int64_t def) {
    auto it = attrs.find(k);
    if (it == attrs.end()) return def;
    if (auto* i = std::get_if<int64_t>(&it->second)) return *i;
    return def;
  };
  a.alpha = num("alpha", a.alpha);
  a.beta = num("beta", a.beta);
  if (kind == OpKind::kMod) a.alpha = integer("fmod", 0) != 0 ? 1.f : 0.f;
  if (kind == OpKind::kIsInf) {  // ONNX's names for which infinities count
    a.alpha = integer("detect_negative", 1) != 0 ? 1.f : 0.f;
    a.beta = integer("detect_positive", 1) != 0 ? 1.f : 0.f;
  }
  const int64_t to = integer("to", static_cast<int64_t>(a.to));
  a.to = (to >= 0 && to < static_cast<int64_t>(std::size(kAllDTypes))) ? static_cast<DType>(to) : DType::kF32;
  a.seed = static_cast<uint64_t>(integer("seed", 0));
  a.training = integer("training", 0) != 0;
  return a;
}

namespace {

Result<std::vector<ValueType>> InferElementwise(const InferContext& ctx) {
  auto kind = OpFromName(ctx.op);
  if (!kind.ok()) return kind.status();
  std::vector<DType> dtypes;
  std::vector<Shape> shapes;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    if (!ctx.inputs[i]) return InvalidArgument(ctx.Describe(), ": input ", i, " is missing");
    dtypes.push_back(ctx.inputs[i]->dtype());
    shapes.push_back(ctx.inputs[i]->shape());
  }
  auto it = ctx.attrs.find("to");
  if (it != ctx.attrs.end()) {
    const int64_t* to = std::get_if<int64_t>(&it->second);
    if (!to || *to < 0 || *to >= static_cast<int64_t>(std::size(kAllDTypes)))
      return InvalidArgument(ctx.Describe(), ": attribute 'to' is not a dtype");
  }
  const OpAttrs attrs = ElementwiseAttrs(*kind, ctx.attrs);
  GF_ASSIGN_OR_RETURN(DType dtype, InferDType(*kind, dtypes, attrs));
  GF_ASSIGN_OR_RETURN(Shape shape, InferShape(*kind, shapes));
  GF_RETURN_IF_ERROR(CheckAttrs(*kind, attrs));
  return std::vector<ValueType>{{dtype, shape}};
}

}  // namespace

std::vector<OpSchema> ElementwiseSchemas() {
  std::vector<OpSchema> out;
  for (const OpInfo& op : AllOps()) {
    OpSchema s{op.name, op.arity, op.arity, 1, &InferElementwise};
    s.elementwise = true;
    out.push_back(s);
  }
  return out;
}

}  // namespace graphfuse
