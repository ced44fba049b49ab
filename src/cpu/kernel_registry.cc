#include "cpu/kernel_registry.h"

#include <functional>
#include <map>
#include <string>

#include "cpu/kernels/kernel_lists.h"

namespace graphfuse {
namespace {

struct Registry {
  std::vector<CpuKernel> kernels;
  std::map<std::string, size_t, std::less<>> by_op;
};

const Registry& GetRegistry() {
  static const Registry registry = [] {
    Registry r;
    for (auto list : {kernels::ElementwiseKernels(), kernels::GemmKernels(), kernels::NormKernels(),
                      kernels::SoftmaxKernels(), kernels::ReduceKernels(), kernels::DataMovementKernels(),
                      kernels::ShapeOpKernels(), kernels::RopeKernels(), kernels::AttentionKernels(),
                      kernels::AttentionCacheKernels(), kernels::FusedRowwiseKernels(), kernels::FusedGemmKernels()})
      for (const CpuKernel& k : list) {
        GF_CHECK(!r.by_op.count(k.op), "CPU kernel of ", k.op, " registered twice");
        r.by_op.emplace(k.op, r.kernels.size());
        r.kernels.push_back(k);
      }
    return r;
  }();
  return registry;
}

}  // namespace

const CpuKernel* FindCpuKernel(std::string_view op) {
  const Registry& r = GetRegistry();
  auto it = r.by_op.find(op);
  return it == r.by_op.end() ? nullptr : &r.kernels[it->second];
}

std::vector<const CpuKernel*> AllCpuKernels() {
  std::vector<const CpuKernel*> out;
  for (const CpuKernel& k : GetRegistry().kernels) out.push_back(&k);
  return out;
}

std::vector<KernelChoice> DescribeCpuKernels(const Graph& g, const PrepareOptions& prepare) {
  PrepareOptions options = prepare;
  if (!options.store) options.store = g.prepared_store();  // as ExecutionPlan::Compile
  std::vector<KernelChoice> out;
  for (const auto& n : g.nodes()) {
    const CpuKernel* k = FindCpuKernel(n->op());
    if (!k || !k->describe) continue;
    std::string how = k->describe(*n, options);
    if (!how.empty()) out.push_back({n->name(), n->op(), std::move(how)});
  }
  return out;
}

}  // namespace graphfuse
