#include "cuda/host_fallback.h"

#include "cpu/executor.h"

namespace graphfuse::cuda {

Status PlanHostFallback(PlanBuilder& pb, const Node& n, const Status& why) {
  GF_ASSIGN_OR_RETURN(std::vector<void*> bufs, pb.NodeBuffers(n));
  auto host_in = std::make_shared<std::vector<Tensor>>();
  auto host_out = std::make_shared<std::vector<Tensor>>();
  for (const Value* v : n.inputs()) host_in->push_back(Tensor::Empty(v->dtype(), v->shape()).value());
  for (const Value* v : n.outputs()) host_out->push_back(Tensor::Empty(v->dtype(), v->shape()).value());
  const Node* node = &n;
  const DeviceMemory* mem = &pb.memory;
  pb.steps.push_back({n.name(),
                      [=](cudaStream_t s) -> Status {
                        // Copies on the plan's stream (ordered with its kernels), waited for here.
                        std::vector<TensorView> in, out;
                        for (size_t i = 0; i < host_in->size(); ++i) {
                          Tensor& t = (*host_in)[i];
                          GF_RETURN_IF_ERROR(mem->Copy(t.data(), bufs[i], t.nbytes(), cudaMemcpyDeviceToHost, s));
                          in.push_back(t.view());
                        }
                        GF_RETURN_IF_ERROR(mem->Sync(s));
                        for (Tensor& t : *host_out) out.push_back(t.view());
                        GF_RETURN_IF_ERROR(RunNodeOnce(*node, in, out, CpuContext{}));
                        for (size_t o = 0; o < host_out->size(); ++o) {
                          Tensor& t = (*host_out)[o];
                          GF_RETURN_IF_ERROR(
                              mem->Copy(bufs[host_in->size() + o], t.data(), t.nbytes(), cudaMemcpyHostToDevice, s));
                        }
                        return mem->Sync(s);
                      },
                      true});
  ++pb.stats.launches;
  ++pb.stats.host_fallbacks;
  pb.lines.push_back(StrCat(n.name(), ": on the host (", why.message(), ")"));
  return Status::Ok();
}

}  // namespace graphfuse::cuda
