// op::Id <-> name (include/graphfuse/op_id.h).
#include "graphfuse/op_id.h"

#include <string>
#include <unordered_map>

namespace graphfuse::op {

namespace {

constexpr const char* kNames[] = {
#define OP(name, ...) #name,
#include "graphfuse/ops.def"
#undef OP
#define GF_IR_OP(name) #name,
#include "graphfuse/op_names.def"
#undef GF_IR_OP
};
static_assert(sizeof(kNames) / sizeof(kNames[0]) == kCount);

}  // namespace

Id FromName(std::string_view name) {
  static const auto* const by_name = [] {
    auto* m = new std::unordered_map<std::string_view, Id>();
    for (int i = 0; i < kCount; ++i) m->emplace(kNames[i], static_cast<Id>(i));
    return m;
  }();
  auto it = by_name->find(name);
  return it == by_name->end() ? kUnknown : it->second;
}

const char* Name(Id id) { return id >= 0 && id < kCount ? kNames[id] : "?"; }

}  // namespace graphfuse::op
