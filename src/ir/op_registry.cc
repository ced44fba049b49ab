#include "ir/op_registry.h"

#include <map>

#include "ir/schemas/schema_lists.h"

namespace graphfuse {

const Tensor* InferContext::ConstInput(size_t i) const {
  Value* v = input(i);
  return v && v->constant() ? v->constant().get() : nullptr;
}

Result<std::vector<int64_t>> InferContext::ConstInts(size_t i, const char* what) const {
  const Tensor* t = ConstInput(i);
  if (!t) {
    if (!input(i)) return InvalidArgument(Describe(), ": the ", what, " input is missing");
    return Unimplemented(Describe(), ": needs a constant ", what,
                         " input (dynamic shapes are not supported); '", input(i)->name(), "' is computed at run time");
  }
  if (t->dtype() != DType::kI64 && t->dtype() != DType::kI32)
    return InvalidArgument(Describe(), ": the ", what, " input must be i64 or i32, got ", DTypeName(t->dtype()));
  std::vector<int64_t> out(static_cast<size_t>(t->numel()));
  for (int64_t k = 0; k < t->numel(); ++k)
    out[k] = t->dtype() == DType::kI64 ? t->data_as<int64_t>()[k] : t->data_as<int32_t>()[k];
  return out;
}

int64_t InferContext::GetInt(const std::string& k, int64_t def) const { return AttrInt(attrs, k, def); }
float InferContext::GetFloat(const std::string& k, float def) const { return AttrFloat(attrs, k, def); }
std::vector<int64_t> InferContext::GetInts(const std::string& k, const std::vector<int64_t>& def) const {
  return AttrInts(attrs, k, def);
}

std::string InferContext::Describe() const {
  std::string s = StrCat("op ", op, " (inputs ");
  for (size_t i = 0; i < inputs.size(); ++i)
    s += StrCat(i ? ", " : "", inputs[i] ? inputs[i]->TypeString() : std::string("<none>"));
  return s + ")";
}

namespace {

struct Registry {
  std::vector<OpSchema> schemas;
  std::map<std::string, size_t> by_name;
};

const Registry& GetRegistry() {
  static const Registry registry = [] {
    Registry r;
    for (auto list : {ElementwiseSchemas(), schemas::GemmSchemas(), schemas::NormSchemas(), schemas::SoftmaxSchemas(),
                      schemas::ReduceSchemas(), schemas::DataMovementSchemas(), schemas::ShapeOpSchemas(),
                      schemas::RopeSchemas(), schemas::AttentionSchemas(), schemas::AttentionCacheSchemas(),
                      schemas::FusedRowwiseSchemas(), schemas::FusedGemmSchemas(), FusedSchemas()})
      for (const OpSchema& s : list) {
        GF_CHECK(!r.by_name.count(s.name), "op ", s.name, " registered twice");
        r.by_name[s.name] = r.schemas.size();
        r.schemas.push_back(s);
      }
    return r;
  }();
  return registry;
}

}  // namespace

const OpSchema* FindSchema(const std::string& op) {
  const Registry& r = GetRegistry();
  auto it = r.by_name.find(op);
  return it == r.by_name.end() ? nullptr : &r.schemas[it->second];
}

const OpSchema* FindSchema(op::Id op) {
  static const std::vector<const OpSchema*> by_id = [] {
    std::vector<const OpSchema*> v(op::kCount, nullptr);
    for (int i = 0; i < op::kCount; ++i) v[i] = FindSchema(std::string(op::Name(static_cast<op::Id>(i))));
    return v;
  }();
  return op >= 0 && op < op::kCount ? by_id[op] : nullptr;
}

std::vector<const OpSchema*> AllSchemas() {
  std::vector<const OpSchema*> out;
  for (const OpSchema& s : GetRegistry().schemas) out.push_back(&s);
  return out;
}

}  // namespace graphfuse
