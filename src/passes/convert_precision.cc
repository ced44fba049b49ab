#include "passes/convert_precision.h"

#include <map>
#include <string>
#include <variant>
#include <vector>

#include "graphfuse/tensor.h"

namespace graphfuse {
namespace {

int64_t DTypeAttr(DType t) { return static_cast<int64_t>(t); }

Result<std::shared_ptr<const Tensor>> Converted(const Tensor& t, DType dt) {
  GF_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(dt, t.shape()));
  const float* src = t.data_as<float>();
  auto* dst = out.data_as<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) dst[i] = dt == DType::kBF16 ? F32ToBF16Bits(src[i]) : F32ToF16Bits(src[i]);
  return std::make_shared<const Tensor>(std::move(out));
}

class Converter {
 public:
  Converter(const Graph& src, DType dt, const PrecisionOptions& o)
      : src_(src), dt_(dt), o_(o), g_(std::make_unique<Graph>(src.name())) {}

  Result<std::unique_ptr<Graph>> Run() {
    for (const Value* v : src_.inputs()) {
      const DType in_dt = o_.narrow_io && v->dtype() == DType::kF32 ? dt_ : v->dtype();
      GF_ASSIGN_OR_RETURN(Value * in, g_->AddInput(v->name(), in_dt, v->shape()));
      map_[v] = v->dtype() == DType::kF32 ? Cast(in, dt_, v->name()) : in;
      if (!map_[v]) return Internal("ConvertPrecision: could not cast input '", v->name(), "'");
    }
    for (const Value* c : src_.constants()) {
      std::shared_ptr<const Tensor> data = c->constant();
      if (c->dtype() == DType::kF32 && dt_ != DType::kF32) {
        GF_ASSIGN_OR_RETURN(data, Converted(*data, dt_));
      }
      GF_ASSIGN_OR_RETURN(map_[c], g_->AddConstant(c->name(), data));
    }
    for (const auto& n : src_.nodes()) GF_RETURN_IF_ERROR(AddNode(*n));
    for (const Value* o : src_.outputs()) {
      Value* v = map_.at(o);
      if (!o_.narrow_io && o->dtype() == DType::kF32 && v->dtype() != DType::kF32) {
        // The narrow value gives its name up to the output, which keeps the model's.
        GF_RETURN_IF_ERROR(g_->RenameValue(v, g_->FreshName(StrCat(o->name(), "_", DTypeName(dt_)))));
        GF_ASSIGN_OR_RETURN(Node * c, g_->AddNode("Cast", {v}, {{"to", DTypeAttr(DType::kF32)}},
                                                  g_->FreshName(StrCat(o->name(), "_to_f32")), 1, {o->name()}));
        v = c->output();
      }
      GF_RETURN_IF_ERROR(g_->MarkOutput(v));
    }
    return std::move(g_);
  }

 private:
  // v cast to `to` (v itself when it already is), named after `hint`.
  Value* Cast(Value* v, DType to, const std::string& hint) {
    if (v->dtype() == to) return v;
    auto c = g_->AddNode("Cast", {v}, {{"to", DTypeAttr(to)}}, g_->FreshName(StrCat(hint, "_to_", DTypeName(to))), 1,
                         {g_->FreshName(StrCat(hint, "_", DTypeName(to)))});
    return c.ok() ? (*c)->output() : nullptr;
  }

  Status AddNode(const Node& n) {
    std::vector<Value*> ins;
    for (const Value* v : n.inputs()) ins.push_back(v ? map_.at(v) : nullptr);
    AttributeMap attrs = n.attrs();
    // A Cast to f32 of a float value (an exporter's upcast around a softmax or a norm) stays in dt.
    if (n.op() == "Cast" && n.GetInt("to", -1) == DTypeAttr(DType::kF32) && ins[0] && IsFloat(ins[0]->dtype()))
      attrs["to"] = DTypeAttr(dt_);
    std::vector<std::string> names;
    for (const Value* o : n.outputs()) names.push_back(o->name());
    // Every op's inference takes f16 and bf16 where it takes f32; one that did not would be
    // refused here, naming the node.
    GF_ASSIGN_OR_RETURN(Node * narrow, g_->AddNode(n.op(), ins, attrs, n.name(), static_cast<int>(n.outputs().size()),
                                                   names));
    for (size_t k = 0; k < n.outputs().size(); ++k) map_[n.output(k)] = narrow->output(k);
    return Status::Ok();
  }

  const Graph& src_;
  const DType dt_;
  const PrecisionOptions o_;
  std::unique_ptr<Graph> g_;
  std::map<const Value*, Value*> map_;
};

}  // namespace

Result<std::unique_ptr<Graph>> ConvertPrecision(const Graph& src, DType dt, const PrecisionOptions& options) {
  if (dt != DType::kF32 && dt != DType::kF16 && dt != DType::kBF16)
    return InvalidArgument("--dtype: a model computes in f32, f16 or bf16, not ", DTypeName(dt));
  Converter c(src, dt, options);  // with f32, a copy: one code path for callers
  return c.Run();
}

}  // namespace graphfuse
