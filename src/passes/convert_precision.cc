#include "passes/convert_precision.h"

#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "core/prepared_store.h"
#include "graphfuse/tensor.h"

namespace graphfuse {
namespace {

int64_t DTypeAttr(DType t) { return static_cast<int64_t>(t); }

// The weights in dt: once per model where the store knows them.
Result<std::shared_ptr<const Tensor>> Converted(PreparedStore* store, const Tensor& t, DType dt) {
  const Tensor* sources[] = {&t};
  return DeriveTensor(store, sources, StrCat("to ", DTypeName(dt)), [&]() -> Result<Tensor> {
    GF_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(dt, t.shape()));
    const float* src = t.data_as<float>();
    auto* dst = out.data_as<uint16_t>();
    for (int64_t i = 0; i < t.numel(); ++i) dst[i] = dt == DType::kBF16 ? F32ToBF16Bits(src[i]) : F32ToF16Bits(src[i]);
    return out;
  });
}

// Each float value of the source is either narrow (computed in dt) or part of an f32 island:
// a computation that starts from integers cast to float (RoPE's positions times its inverse
// frequencies, a mask built from token ids) and reads nothing narrow but constants. Islands stay
// in f32, because dt would round what they compute (bf16 holds integers exactly only to 256);
// where an island value meets a narrow one it is cast to dt once.
class Converter {
 public:
  Converter(const Graph& src, DType dt, const PrecisionOptions& o)
      : src_(src), dt_(dt), o_(o), g_(std::make_unique<Graph>(src.name())) {
    g_->set_prepared_store(src.prepared_store_shared());
  }

  Result<std::unique_ptr<Graph>> Run() {
    for (const Value* v : src_.inputs()) {
      const DType in_dt = o_.narrow_io && v->dtype() == DType::kF32 ? dt_ : v->dtype();
      GF_ASSIGN_OR_RETURN(Value * in, g_->AddInput(v->name(), in_dt, v->shape()));
      map_[v] = v->dtype() == DType::kF32 ? Cast(in, dt_, v->name()) : in;
      if (!map_[v]) return Internal("ConvertPrecision: could not cast input '", v->name(), "'");
    }
    for (const auto& n : src_.nodes()) GF_RETURN_IF_ERROR(AddNode(*n));
    for (const Value* o : src_.outputs()) {
      GF_ASSIGN_OR_RETURN(Value * v, Mapped(o, Want::kAsIs));
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
  enum class Want { kAsIs, kNarrow, kF32 };

  // v cast to `to` (v itself when it already is), named after `hint`.
  Value* Cast(Value* v, DType to, const std::string& hint) {
    if (v->dtype() == to) return v;
    auto c = g_->AddNode("Cast", {v}, {{"to", DTypeAttr(to)}}, g_->FreshName(StrCat(hint, "_to_", DTypeName(to))), 1,
                         {g_->FreshName(StrCat(hint, "_", DTypeName(to)))});
    return c.ok() ? (*c)->output() : nullptr;
  }

  // The new graph's value for source value v: an f32 constant in the form `want` asks for
  // (converted once, on first use narrow; kept f32 where an island reads it), an island value
  // cast to dt where a narrow node reads it (once), anything else as mapped.
  Result<Value*> Mapped(const Value* v, Want want) {
    if (v->constant()) {
      const bool convert = v->dtype() == DType::kF32 && want != Want::kF32;
      auto& slot = convert ? narrow_consts_[v] : f32_consts_[v];
      if (!slot) {
        std::shared_ptr<const Tensor> data = v->constant();
        if (convert) {
          GF_ASSIGN_OR_RETURN(data, Converted(g_->prepared_store(), *data, dt_));
        }
        const bool both = narrow_consts_.count(v) && f32_consts_.count(v);
        GF_ASSIGN_OR_RETURN(slot, g_->AddConstant(both ? g_->FreshName(StrCat(v->name(), "_", convert ? DTypeName(dt_) : "f32"))
                                                       : v->name(),
                                                  data));
      }
      return slot;
    }
    Value* m = map_.at(v);
    if (want == Want::kNarrow && m->dtype() == DType::kF32 && island_.count(m)) {
      Value*& c = island_casts_[m];
      if (!c) c = Cast(m, dt_, m->name());
      if (!c) return Internal("ConvertPrecision: could not cast '", m->name(), "' to ", DTypeName(dt_));
      return c;
    }
    return m;
  }

  Status AddNode(const Node& n) {
    // Narrow: the node reads a narrow float value, or (reading no island) only constants.
    bool reads_narrow = false, reads_island = false, reads_float = false;
    for (const Value* v : n.inputs()) {
      if (!v || !IsFloat(v->dtype())) continue;
      reads_float = true;
      if (v->constant()) continue;
      const Value* m = map_.at(v);
      (island_.count(m) ? reads_island : reads_narrow) = true;
    }
    const bool int_to_f32 = n.is(op::Cast) && n.GetInt("to", -1) == DTypeAttr(DType::kF32) && n.input(0) &&
                            !IsFloat(n.input(0)->dtype());
    // A node reading no float value (a Cast from an integer, ConstantOfShape, RandomNormal)
    // starts an island when it makes f32; one reading only island values and constants is in it.
    const bool island = int_to_f32 || (!reads_narrow && (reads_island || !reads_float));
    std::vector<Value*> ins;
    for (const Value* v : n.inputs()) {
      if (!v) {
        ins.push_back(nullptr);
        continue;
      }
      GF_ASSIGN_OR_RETURN(Value * m, Mapped(v, !IsFloat(v->dtype()) ? Want::kAsIs : island ? Want::kF32 : Want::kNarrow));
      ins.push_back(m);
    }
    AttributeMap attrs = n.attrs();
    // A Cast to f32 of a narrow value (an exporter's upcast around a softmax or a norm) stays in dt.
    if (n.is(op::Cast) && n.GetInt("to", -1) == DTypeAttr(DType::kF32) && !island) attrs["to"] = DTypeAttr(dt_);
    std::vector<std::string> names;
    for (const Value* o : n.outputs()) names.push_back(o->name());
    // Every op's inference takes f16 and bf16 where it takes f32; one that did not would be
    // refused here, naming the node.
    GF_ASSIGN_OR_RETURN(Node * out, g_->AddNode(n.op(), ins, attrs, n.name(), static_cast<int>(n.outputs().size()),
                                                names));
    for (size_t k = 0; k < n.outputs().size(); ++k) {
      map_[n.output(k)] = out->output(k);
      if (island && out->output(k)->dtype() == DType::kF32) island_.insert(out->output(k));
    }
    return Status::Ok();
  }

  const Graph& src_;
  const DType dt_;
  const PrecisionOptions o_;
  std::unique_ptr<Graph> g_;
  std::map<const Value*, Value*> map_;                            // source -> new (not constants)
  std::map<const Value*, Value*> narrow_consts_, f32_consts_;     // source constant -> new
  std::set<const Value*> island_;                                 // new f32 values of islands
  std::map<const Value*, Value*> island_casts_;                   // island value -> its cast to dt
};

}  // namespace

Result<std::unique_ptr<Graph>> ConvertPrecision(const Graph& src, DType dt, const PrecisionOptions& options) {
  if (dt != DType::kF32 && dt != DType::kF16 && dt != DType::kBF16)
    return InvalidArgument("--dtype: a model computes in f32, f16 or bf16, not ", DTypeName(dt));
  Converter c(src, dt, options);  // with f32, a copy: one code path for callers
  return c.Run();
}

}  // namespace graphfuse
