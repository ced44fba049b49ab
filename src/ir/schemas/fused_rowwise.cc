// FusedNorm and FusedSoftmax: a row op (RMSNorm / LayerNormalization / Softmax over the last
// axis) with the elementwise groups around it, formed by src/passes/fuse_rowwise.cc. How a
// node's inputs and outputs map onto its bodies (rowwise_layout.h; the attributes are documented
// in src/cpu/kernels/fused_rowwise.cc, the CPU kernels) and the nodes' inference.
#include "ir/schemas/rowwise_layout.h"

#include "ir/elementwise_body.h"
#include "ir/schemas/infer_util.h"
#include "ir/schemas/schema_lists.h"

namespace graphfuse::schemas {

const Graph* GraphAttr(const AttributeMap& attrs, const char* key) {
  auto it = attrs.find(key);
  if (it == attrs.end()) return nullptr;
  const auto* g = std::get_if<std::shared_ptr<const Graph>>(&it->second);
  return g ? g->get() : nullptr;
}

// The layouts are shared by inference and the kernels, so that a kernel never indexes past what
// inference accepted.

namespace {

bool RowDTypeOk(DType t, RowDTypes rows) { return rows == RowDTypes::kAnyFloat ? IsFloat(t) : t == DType::kF32; }
const char* RowDTypeWord(RowDTypes rows) { return rows == RowDTypes::kAnyFloat ? "a float dtype" : "f32"; }

}  // namespace

Result<NormLayout> ReadNormLayout(const std::string& where, const AttributeMap& attrs, size_t num_inputs,
                                  RowDTypes rows) {
  NormLayout l;
  l.body = GraphAttr(attrs, "body");
  if (!l.body) return InvalidArgument(where, ": needs a 'body' graph attribute");
  const std::string norm = AttrString(attrs, "norm", "");
  const op::Id norm_op = op::FromName(norm);
  if (norm_op != op::RMSNorm && norm_op != op::LayerNormalization)
    return InvalidArgument(where, ": attribute norm is '", norm, "', expected RMSNorm or LayerNormalization");
  l.layer_norm = norm_op == op::LayerNormalization;
  l.body_inputs = l.body->inputs().size();
  if (num_inputs < l.body_inputs)
    return InvalidArgument(where, ": has ", num_inputs, " inputs, its body takes ", l.body_inputs);
  l.params = num_inputs - l.body_inputs;
  if (l.params > (l.layer_norm ? 2u : 1u) || (l.layer_norm && l.params < 1))
    return InvalidArgument(where, ": ", norm, " takes ", l.layer_norm ? "scale and an optional bias" : "an optional scale",
                           " after the body's ", l.body_inputs, " inputs, got ", l.params, " more inputs");
  const int64_t nout = static_cast<int64_t>(l.body->outputs().size());
  l.norm_input = AttrInt(attrs, "norm_input", -1);
  l.prologue_outputs = AttrInt(attrs, "prologue_outputs", -1);
  if (l.prologue_outputs < 0 || l.prologue_outputs > nout || nout > l.prologue_outputs + 1 || l.norm_input < 0 ||
      l.norm_input >= nout || (nout == l.prologue_outputs + 1 && l.norm_input != l.prologue_outputs))
    return InvalidArgument(where, ": norm_input ", l.norm_input, " / prologue_outputs ", l.prologue_outputs,
                           " do not fit a body with ", nout, " outputs");
  l.x = l.body->outputs()[static_cast<size_t>(l.norm_input)];
  if (!RowDTypeOk(l.x->dtype(), rows) || l.x->shape().empty())
    return InvalidArgument(where, ": the norm input ", l.x->TypeString(), " must be ", RowDTypeWord(rows),
                           " of rank >= 1");
  return l;
}

Result<SoftmaxLayout> ReadSoftmaxLayout(const std::string& where, const AttributeMap& attrs,
                                        const std::vector<const Value*>& inputs, RowDTypes rows) {
  SoftmaxLayout l;
  l.prologue = GraphAttr(attrs, "prologue");
  l.epilogue = GraphAttr(attrs, "epilogue");
  if (!l.prologue && !l.epilogue) return InvalidArgument(where, ": needs a 'prologue' or an 'epilogue' graph attribute");
  if (l.prologue) {
    const int64_t nout = static_cast<int64_t>(l.prologue->outputs().size());
    l.prologue_inputs = l.prologue->inputs().size();
    l.softmax_input = AttrInt(attrs, "softmax_input", -1);
    l.prologue_outputs = AttrInt(attrs, "prologue_outputs", -1);
    if (l.prologue_outputs < 0 || l.prologue_outputs > nout || nout > l.prologue_outputs + 1 || l.softmax_input < 0 ||
        l.softmax_input >= nout || (nout == l.prologue_outputs + 1 && l.softmax_input != l.prologue_outputs))
      return InvalidArgument(where, ": softmax_input ", l.softmax_input, " / prologue_outputs ", l.prologue_outputs,
                             " do not fit a prologue with ", nout, " outputs");
    const Value* x = l.prologue->outputs()[static_cast<size_t>(l.softmax_input)];
    l.x = {x->dtype(), x->shape()};
  }
  if (inputs.size() < l.prologue_inputs)
    return InvalidArgument(where, ": has ", inputs.size(), " inputs, the prologue reads ", l.prologue_inputs);
  if (!l.prologue) {
    if (!inputs[0]) return InvalidArgument(where, ": input 0 is missing");
    l.x = {inputs[0]->dtype(), inputs[0]->shape()};
  }
  if (!RowDTypeOk(l.x.dtype, rows) || l.x.shape.empty())
    return InvalidArgument(where, ": the softmax input ", TypeStr(l.x.dtype, l.x.shape), " must be ", RowDTypeWord(rows),
                           " of rank >= 1");
  const size_t rest = inputs.size() - l.prologue_inputs;
  if (l.epilogue) {
    const size_t nin = l.epilogue->inputs().size();
    l.epilogue_input = AttrInt(attrs, "epilogue_input", -1);
    if (l.epilogue_input < 0 || l.epilogue_input >= static_cast<int64_t>(nin) || rest + 1 != nin)
      return InvalidArgument(where, ": epilogue_input ", l.epilogue_input, " does not fit an epilogue with ", nin,
                             " inputs and ", rest, " node inputs after the prologue's");
    const Value* p = l.epilogue->inputs()[static_cast<size_t>(l.epilogue_input)];
    const Value* out0 = l.epilogue->outputs().empty() ? nullptr : l.epilogue->outputs()[0];
    if (p->dtype() != l.x.dtype || p->shape() != l.x.shape || !out0 || !RowDTypeOk(out0->dtype(), rows) ||
        out0->shape() != l.x.shape)
      return InvalidArgument(where, ": the epilogue must read the softmax's rows ", TypeStr(l.x.dtype, l.x.shape),
                             " and write ", RowDTypeWord(rows), ShapeToString(l.x.shape));
    l.main_outputs = l.epilogue->outputs().size();
  } else if (rest != 0) {
    return InvalidArgument(where, ": ", rest, " inputs beyond the prologue's, but no epilogue");
  }
  return l;
}

namespace {

// Checks node inputs [offset, offset + n) against a body's inputs, skipping body input `skip`.
Status CheckBodyInputs(const std::string& where, const char* what, const Graph& body,
                       const std::vector<const Value*>& inputs, size_t offset, int64_t skip = -1) {
  size_t k = offset;
  for (size_t i = 0; i < body.inputs().size(); ++i) {
    if (static_cast<int64_t>(i) == skip) continue;
    const Value* b = body.inputs()[i];
    const Value* in = k < inputs.size() ? inputs[k] : nullptr;
    if (!in || in->dtype() != b->dtype() || in->shape() != b->shape())
      return InvalidArgument(where, ": input ", k, " is ", TypeStr(in), ", the ", what, " reads ", b->TypeString());
    ++k;
  }
  return Status::Ok();
}

std::vector<const Value*> ConstInputs(const InferContext& ctx) { return {ctx.inputs.begin(), ctx.inputs.end()}; }

Result<std::vector<ValueType>> InferFusedNorm(const InferContext& ctx) {
  const std::string where = ctx.Describe();
  // Any float rows: the CUDA kernels load f16 / bf16 and compute in f32; the CPU kernels read the
  // layout again with RowDTypes::kF32 and refuse others.
  GF_ASSIGN_OR_RETURN(NormLayout l, ReadNormLayout(where, ctx.attrs, ctx.inputs.size(), RowDTypes::kAnyFloat));
  GF_RETURN_IF_ERROR(CheckBodyInputs(where, "body", *l.body, ConstInputs(ctx), 0));
  const int64_t d = l.x->shape().back();
  for (size_t i = 0; i < l.params; ++i) {
    const Value* p = ctx.input(l.body_inputs + i);
    if (!p) return InvalidArgument(where, ": input ", l.body_inputs + i, " (norm parameter) is missing");
    const Shape& s = p->shape();
    const char* dt = DTypeName(l.x->dtype());
    if (p->dtype() != l.x->dtype() || s.size() > 1 || (s.size() == 1 && s[0] != 1 && s[0] != d))
      return InvalidArgument(where, ": norm parameter ", p->TypeString(), " must be ", dt, "[", d, "], ", dt,
                             "[1] or a scalar (the rows are ", l.x->TypeString(), ")");
  }
  std::vector<ValueType> out{{l.x->dtype(), l.x->shape()}};
  for (int64_t k = 0; k < l.prologue_outputs; ++k) {
    const Value* o = l.body->outputs()[static_cast<size_t>(k)];
    out.push_back({o->dtype(), o->shape()});
  }
  return out;
}

Result<std::vector<ValueType>> InferFusedSoftmax(const InferContext& ctx) {
  const std::string where = ctx.Describe();
  const std::vector<const Value*> inputs = ConstInputs(ctx);
  GF_ASSIGN_OR_RETURN(SoftmaxLayout l, ReadSoftmaxLayout(where, ctx.attrs, inputs, RowDTypes::kAnyFloat));
  if (l.prologue) GF_RETURN_IF_ERROR(CheckBodyInputs(where, "prologue", *l.prologue, inputs, 0));
  if (l.epilogue)
    GF_RETURN_IF_ERROR(CheckBodyInputs(where, "epilogue", *l.epilogue, inputs, l.prologue_inputs, l.epilogue_input));
  std::vector<ValueType> out;
  if (l.epilogue) {
    for (const Value* o : l.epilogue->outputs()) out.push_back({o->dtype(), o->shape()});
  } else {
    out.push_back(l.x);
  }
  for (int64_t k = 0; k < l.prologue_outputs; ++k) {
    const Value* o = l.prologue->outputs()[static_cast<size_t>(k)];
    out.push_back({o->dtype(), o->shape()});
  }
  return out;
}

}  // namespace

std::vector<OpSchema> FusedRowwiseSchemas() {
  constexpr int kMaxIn = static_cast<int>(2 * kMaxBodyInputs + 2);
  return {
      {"FusedNorm", 1, kMaxIn, -1, InferFusedNorm},
      {"FusedSoftmax", 1, kMaxIn, -1, InferFusedSoftmax},
  };
}

}  // namespace graphfuse::schemas
