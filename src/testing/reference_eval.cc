#include "testing/reference_eval.h"

#include <map>

#include "ir/op_registry.h"
#include "ops/reference.h"

namespace graphfuse {

Result<std::vector<double>> ReferenceEvalAt(const Graph& g, std::span<const TensorView> inputs, int64_t index) {
  if (g.outputs().empty()) return InvalidArgument("graph has no outputs");
  const Shape& space = g.outputs()[0]->shape();
  // Multi-index of `index` in the output space.
  std::vector<int64_t> idx(space.size());
  int64_t rem = index;
  for (size_t d = space.size(); d-- > 0;) {
    idx[d] = rem % space[d];
    rem /= space[d];
  }
  // Element of a value (of a shape broadcast to `space`) at that multi-index.
  auto offset_in = [&](const Shape& s) {
    int64_t off = 0, stride = 1;
    for (size_t k = 0; k < s.size(); ++k) {
      const size_t d = s.size() - 1 - k, dout = space.size() - 1 - k;
      off += (s[d] == 1 ? 0 : idx[dout]) * stride;
      stride *= s[d];
    }
    return off;
  };
  std::map<const Value*, double> val;
  for (size_t i = 0; i < g.inputs().size(); ++i) val[g.inputs()[i]] = LoadAsDouble(inputs[i], offset_in(inputs[i].shape));
  for (const Value* c : g.constants()) val[c] = c->constant()->GetAsDouble(offset_in(c->shape()));
  for (const auto& n : g.nodes()) {
    auto kind = OpFromName(n->op());
    if (!kind.ok()) return Unimplemented(n->Describe(), ": the float64 graph reference covers op-table nodes only");
    if (n->output()->shape() != space)
      return Unimplemented(n->Describe(), ": computes ", n->output()->TypeString(), ", not over the output space");
    double x[3] = {0, 0, 0};
    std::vector<DType> dtypes;
    for (size_t k = 0; k < n->inputs().size(); ++k) x[k] = val.at(n->input(k)), dtypes.push_back(n->input(k)->dtype());
    const OpAttrs a = ElementwiseAttrs(*kind, n->attrs());
    double r = ComputesInIntegers(*kind, dtypes)
                   ? static_cast<double>(ReferenceScalarInt(*kind, static_cast<int64_t>(x[0]), static_cast<int64_t>(x[1]),
                                                            static_cast<int64_t>(x[2]), a, index))
                   : ReferenceScalar(*kind, x[0], x[1], x[2], a, index);
    val[n->output()] = r;
  }
  std::vector<double> out;
  for (const Value* o : g.outputs()) out.push_back(val.at(o));
  return out;
}

}  // namespace graphfuse
