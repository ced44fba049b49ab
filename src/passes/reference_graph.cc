#include "passes/reference_graph.h"

#include <map>
#include <set>

namespace graphfuse {

Result<std::shared_ptr<Graph>> BuildReferenceGraph(const std::string& name, const std::vector<Value*>& inputs,
                                                   const std::vector<Node*>& members,
                                                   const std::vector<const Value*>& outputs) {
  auto ref = std::make_shared<Graph>(name);
  std::map<const Value*, Value*> map;
  std::set<std::string> used;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string in_name = inputs[i]->name();
    if (used.count(in_name)) in_name = StrCat(in_name, ".in", i);
    used.insert(in_name);
    GF_ASSIGN_OR_RETURN(Value * ri, ref->AddInput(in_name, inputs[i]->dtype(), inputs[i]->shape()));
    map.emplace(inputs[i], ri);
  }
  for (const Node* n : members) {
    std::vector<Value*> ins;
    for (Value* in : n->inputs()) {
      if (in && !map.count(in)) {
        if (!in->constant())
          return Internal(name, ": ", n->Describe(), " reads '", in->name(),
                          "', which is neither an input of the fused node, a member's result nor a constant");
        GF_ASSIGN_OR_RETURN(Value * c, ref->AddConstant(in->name(), in->constant()));
        map[in] = c;
      }
      ins.push_back(in ? map.at(in) : nullptr);
    }
    std::vector<std::string> out_names;
    for (const Value* o : n->outputs()) out_names.push_back(o->name());
    auto rn = ref->AddNode(n->op(), ins, n->attrs(), n->name(), -1, out_names);
    if (!rn.ok()) return rn.status().WithContext(StrCat("building the reference of ", name));
    for (size_t i = 0; i < n->outputs().size(); ++i) map[n->output(i)] = (*rn)->output(i);
  }
  for (const Value* o : outputs) GF_RETURN_IF_ERROR(ref->MarkOutput(map.at(o)));
  return ref;
}

}  // namespace graphfuse
