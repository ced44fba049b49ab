#include "cuda/plan_builder.h"

#include <algorithm>
#include <chrono>

#include "cuda/cuda_status.h"

namespace graphfuse::cuda {

PlanBuilder::~PlanBuilder() {
  for (auto& c : cleanups) c();
  for (cudaLibrary_t l : libraries_) cudaLibraryUnload(l);
  if (lt) cublasLtDestroy(lt);
  if (blas) cublasDestroy(blas);
  if (stream) cudaStreamDestroy(stream);
}

Result<std::vector<void*>> PlanBuilder::NodeBuffers(const Node& n) {
  std::vector<void*> out;
  for (const Value* v : n.inputs()) {
    if (!v) return Unimplemented("an omitted optional input");
    GF_ASSIGN_OR_RETURN(void* p, memory.Buffer(v));
    out.push_back(p);
  }
  for (const Value* v : n.outputs()) {
    GF_ASSIGN_OR_RETURN(void* p, memory.Buffer(v));
    out.push_back(p);
  }
  return out;
}

Result<cudaKernel_t> PlanBuilder::Load(const CudaKernelSource& k) {
  if (auto it = kernels_.find(k.name); it != kernels_.end()) return it->second;
  const auto t0 = std::chrono::steady_clock::now();
  GF_ASSIGN_OR_RETURN(CompiledKernel c, compiler->Compile(k));
  if (!c.from_cache)
    stats.compile_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cudaLibrary_t lib = nullptr;
  GF_CUDA(cudaLibraryLoadData(&lib, c.image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
          StrCat("loading kernel '", k.name, "'"));
  libraries_.push_back(lib);
  cudaKernel_t kernel = nullptr;
  GF_CUDA(cudaLibraryGetKernel(&kernel, lib, k.name.c_str()), StrCat("finding kernel '", k.name, "'"));
  kernels_[k.name] = kernel;
  return kernel;
}

Status PlanBuilder::AddKernelStep(const std::string& label, const CudaKernelSource& k, std::vector<void*> args) {
  if (k.num_elements == 0) return Status::Ok();
  if (emu) {
    GF_ASSIGN_OR_RETURN(std::shared_ptr<const HostKernel> host, kernel_cache->Host(k));
    // A few blocks: grid-stride loops cover the rest (any grid is correct).
    const unsigned grid = k.row_kernel ? static_cast<unsigned>(std::clamp<int64_t>(k.scalar_work_items, 1, 4)) : 2u;
    const std::vector<int64_t> sizes = k.sizes;
    steps.push_back({label, [host, args, sizes, grid](cudaStream_t) -> Status {
                       host->Launch(args, sizes, grid);
                       return Status::Ok();
                     }});
    ++stats.launches;
    ++stats.generated;
    return Status::Ok();
  }
  GF_ASSIGN_OR_RETURN(cudaKernel_t kernel, Load(k));
  const int64_t items =
      k.row_kernel ? k.scalar_work_items : (k.has_vector_path ? k.vector_work_items : k.scalar_work_items);
  const int64_t blocks = k.row_kernel
                             ? std::clamp<int64_t>(items, 1, int64_t{1} << 20)
                             : std::clamp<int64_t>((items + kCudaBlockSize - 1) / kCudaBlockSize, 1, int64_t{16} * sms);
  // The parameter array cudaLaunchKernel reads, built once: the pointers and sizes never change
  // (the sizes, by value: an array of long long is gf::Sizes<N>).
  struct Params {
    std::vector<void*> values, addresses;
    std::vector<int64_t> sizes;
  };
  auto params = std::make_shared<Params>();
  params->values = std::move(args);
  params->sizes = k.sizes;
  for (void*& v : params->values) params->addresses.push_back(&v);
  if (!params->sizes.empty()) params->addresses.push_back(params->sizes.data());
  const std::string name = k.name;
  steps.push_back({label, [kernel, blocks, params, name](cudaStream_t s) -> Status {
                     GF_CUDA(
                         cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(static_cast<unsigned>(blocks)),
                                          dim3(kCudaBlockSize), params->addresses.data(), 0, s),
                         StrCat("launching ", name));
                     return Status::Ok();
                   }});
  ++stats.launches;
  ++stats.generated;
  return Status::Ok();
}

}  // namespace graphfuse::cuda
