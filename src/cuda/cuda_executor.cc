#include "cuda_executor.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>

#include "../cpu/executor.h"
#include "../target/memory_plan.h"
#include "codegen.h"
#include "host_emulation.h"
#include "nvrtc_compile.h"

namespace graphfuse::cuda {
namespace {

Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::Ok();
  return Internal(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

Status BlasStatus(cublasStatus_t s, const std::string& what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Internal(what, ": cuBLAS ", cublasGetStatusName(s), " (", cublasGetStatusString(s), ")");
}

#define GF_CUDA(expr, what) GF_RETURN_IF_ERROR(CudaStatus((expr), (what)))
#define GF_BLAS(expr, what) GF_RETURN_IF_ERROR(BlasStatus((expr), (what)))

size_t Bytes(const Value* v) { return static_cast<size_t>(v->numel()) * DTypeSize(v->dtype()); }

// C[M,N] (row stride ldc) = A[M,K] (lda) * B[K,N] (ldb), row-major f32, as cuBLAS's
// column-major C^T = B^T A^T; `batch` > 1 steps each operand by its stride. trans_b: B is
// stored [N,K] (ldb) and C = A B^T, as C^T = op_T(B's storage) A^T.
Status RowMajorSgemm(cublasHandle_t h, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int64_t stride_a,
                     const float* b, int64_t ldb, int64_t stride_b, float* c, int64_t ldc, int64_t stride_c,
                     int64_t batch, const std::string& where, bool trans_b) {
  const float one = 1.f, zero = 0.f;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1) {
    GF_BLAS(cublasSgemm(h, op_b, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &one, b,
                        static_cast<int>(ldb), a, static_cast<int>(lda), &zero, c, static_cast<int>(ldc)),
            where);
    return Status::Ok();
  }
  GF_BLAS(cublasSgemmStridedBatched(h, op_b, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                    static_cast<int>(k), &one, b, static_cast<int>(ldb), stride_b, a,
                                    static_cast<int>(lda), stride_a, &zero, c, static_cast<int>(ldc), stride_c,
                                    static_cast<int>(batch)),
          where);
  return Status::Ok();
}

// RowMajorSgemm's arithmetic on the host (accumulating in double), for emulated plans.
void HostSgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int64_t stride_a, const float* b,
               int64_t ldb, int64_t stride_b, float* c, int64_t ldc, int64_t stride_c, int64_t batch, bool trans_b) {
  for (int64_t t = 0; t < batch; ++t)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t q = 0; q < k; ++q)
          acc += static_cast<double>(a[t * stride_a + i * lda + q]) *
                 b[t * stride_b + (trans_b ? j * ldb + q : q * ldb + j)];
        c[t * stride_c + i * ldc + j] = static_cast<float>(acc);
      }
}

struct Step {
  std::string label;
  std::function<Status(cudaStream_t)> run;
  bool host = false;  // synchronizes with the host (no CUDA-graph capture)
};

}  // namespace

bool CudaDeviceAvailable(int device, std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= device) {
    if (why)
      *why = e != cudaSuccess ? StrCat("no CUDA device (cudaGetDeviceCount: ", cudaGetErrorString(e), ")")
                              : StrCat("no CUDA device ", device, " (", count, " found)");
    return false;
  }
  return true;
}

Result<double> DeviceCopyMs(int64_t bytes, int repeats, int device) {
  std::string why;
  if (!CudaDeviceAvailable(device, &why)) return NotFound(why);
  GF_CUDA(cudaSetDevice(device), "cudaSetDevice");
  void *a = nullptr, *b = nullptr;
  GF_CUDA(cudaMalloc(&a, static_cast<size_t>(bytes)), "cudaMalloc");
  const cudaError_t eb = cudaMalloc(&b, static_cast<size_t>(bytes));
  if (eb != cudaSuccess) cudaFree(a);
  GF_CUDA(eb, "cudaMalloc");
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> ms;
  cudaError_t err = cudaMemcpy(b, a, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice);  // warm-up
  for (int r = 0; r < std::max(1, repeats) && err == cudaSuccess; ++r) {
    cudaEventRecord(start);
    cudaMemcpyAsync(b, a, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    err = cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(a);
  cudaFree(b);
  GF_CUDA(err, "timing a device-to-device copy");
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct CudaExecutor::Impl {
  const Graph* graph = nullptr;
  CudaExecOptions opts;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* blas_workspace = nullptr;
  size_t blas_workspace_bytes = size_t{32} << 20;
  std::vector<void*> allocations;
  std::vector<cudaLibrary_t> libraries;
  std::vector<std::function<void()>> cleanups;  // cuBLASLt descriptors
  std::map<const Value*, void*> dev;
  std::map<std::string, cudaKernel_t> kernels;  // by kernel name (identical groups share one)
  std::vector<Step> steps;
  std::vector<std::string> lines;
  CudaExecStats stats;
  std::unique_ptr<NvrtcCompiler> compiler;
  int sms = 1;
  cudaGraph_t cuda_graph = nullptr;
  cudaGraphExec_t graph_exec = nullptr;
  bool ran = false;
  bool emu = false;  // CudaExecOptions::emulate: host memory, host-compiled kernels, host GEMMs
  std::map<std::string, std::shared_ptr<HostKernel>> host_kernels;

  // Device memory planning (src/target/memory_plan.h). Values that live between nodes of the plan
  // (not the graph's inputs, outputs or constants) and per-node scratch take pooled blocks by
  // liveness: every step runs in plan order on one stream (or in the CUDA graph captured from
  // it), so a block whose last reader is top-level node i can be handed to any value first
  // written after node i. Each block is allocated when the planner creates it.
  std::optional<MemoryPlanner> memory;  // while planning the top-level graph
  std::vector<void*> blocks;            // device memory of each planned block
  std::set<const Value*> pinned;        // graph outputs: never pooled

  // The device memory of a pooled placement (allocated for a new block).
  Result<void*> BlockMemory(const MemoryPlacement& p, const std::string& what) {
    if (p.new_block) {
      GF_ASSIGN_OR_RETURN(void* ptr, Alloc(static_cast<size_t>(p.bytes), what));
      blocks.push_back(ptr);
    }
    return blocks[static_cast<size_t>(p.block)];
  }
  // One buffer of `bytes` for `values` (a node's outputs laid out in it): pooled until the last
  // of them is read, unless one is a graph output or planning is not pooling.
  Result<void*> SharedBuffer(std::span<const Value* const> values, size_t bytes, const std::string& what) {
    bool pool = memory.has_value();
    for (const Value* v : values) pool = pool && !v->constant() && !pinned.count(v);
    if (!pool) return Alloc(bytes, what);
    return BlockMemory(memory->PlaceTogether(values, static_cast<int64_t>(bytes)), what);
  }
  // Scratch for the node being planned (workspaces, attention's per-head copies and scores).
  Result<void*> Scratch(size_t bytes, const std::string& what) {
    if (!memory) return Alloc(bytes, what);
    return BlockMemory(memory->Scratch(static_cast<int64_t>(bytes)), what);
  }
  // `view` aliases `of`'s buffer: `of`'s block (if pooled) lives as long as either.
  void Alias(const Value* view, const Value* of) {
    if (memory) memory->Alias(view, of);
  }

  ~Impl() {
    if (stream) cudaStreamSynchronize(stream);
    if (graph_exec) cudaGraphExecDestroy(graph_exec);
    if (cuda_graph) cudaGraphDestroy(cuda_graph);
    for (auto& c : cleanups) c();
    for (cudaLibrary_t l : libraries) cudaLibraryUnload(l);
    for (void* p : allocations) emu ? std::free(p) : static_cast<void>(cudaFree(p));
    if (lt) cublasLtDestroy(lt);
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }

  Result<void*> Alloc(size_t bytes, const std::string& what) {
    void* p = nullptr;
    if (emu) {
      p = std::aligned_alloc(64, (std::max<size_t>(bytes, 16) + 63) / 64 * 64);
      if (!p) return ResourceExhausted("allocating ", bytes, " bytes for ", what);
    } else {
      GF_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 16)), StrCat("cudaMalloc of ", bytes, " bytes for ", what));
    }
    allocations.push_back(p);
    stats.device_bytes += static_cast<int64_t>(bytes);
    return p;
  }

  // The device buffer of a value (allocated on first use; constants uploaded then; values
  // between nodes pooled, above).
  Result<void*> Buffer(const Value* v) {
    if (auto it = dev.find(v); it != dev.end()) return it->second;
    GF_ASSIGN_OR_RETURN(void* p, SharedBuffer({&v, 1}, Bytes(v), StrCat("value '", v->name(), "' ", v->TypeString())));
    if (v->constant()) {
      GF_RETURN_IF_ERROR(Copy(p, v->constant()->data(), Bytes(v), cudaMemcpyHostToDevice, stream)
                             .WithContext(StrCat("uploading constant '", v->name(), "'")));
    }
    dev[v] = p;
    return p;
  }

  // Stream-ordered copy (a plain memcpy when emulating).
  Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) const {
    if (bytes == 0) return Status::Ok();
    if (emu) {
      std::memmove(dst, src, bytes);
      return Status::Ok();
    }
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, kind, s), "cudaMemcpyAsync");
  }
  // Stream-ordered zero fill (a plain memset when emulating).
  Status Zero(void* dst, size_t bytes, cudaStream_t s, const std::string& where) const {
    if (emu) return (std::memset(dst, 0, bytes), Status::Ok());
    return CudaStatus(cudaMemsetAsync(dst, 0, bytes, s), where);
  }
  Status Sync(cudaStream_t s) const { return emu ? Status::Ok() : CudaStatus(cudaStreamSynchronize(s), "synchronizing"); }
  Status Gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb,
              int64_t stride_b, float* c, int64_t ldc, int64_t stride_c, int64_t batch, const std::string& where,
              bool trans_b = false) const {
    if (emu) {
      HostSgemm(m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch, trans_b);
      return Status::Ok();
    }
    return RowMajorSgemm(blas, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch, where, trans_b);
  }

  Result<cudaKernel_t> Load(const CudaKernelSource& k) {
    if (auto it = kernels.find(k.name); it != kernels.end()) return it->second;
    const auto t0 = std::chrono::steady_clock::now();
    GF_ASSIGN_OR_RETURN(CompiledKernel c, compiler->Compile(k));
    if (!c.from_cache) stats.compile_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cudaLibrary_t lib = nullptr;
    GF_CUDA(cudaLibraryLoadData(&lib, c.image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
            StrCat("loading kernel '", k.name, "'"));
    libraries.push_back(lib);
    cudaKernel_t kernel = nullptr;
    GF_CUDA(cudaLibraryGetKernel(&kernel, lib, k.name.c_str()), StrCat("finding kernel '", k.name, "'"));
    kernels[k.name] = kernel;
    return kernel;
  }

  // A step launching generated kernel `k` on the given device pointers (its parameters).
  Status AddKernelStep(const std::string& label, const CudaKernelSource& k, std::vector<void*> args) {
    if (k.num_elements == 0) return Status::Ok();
    if (emu) {
      std::shared_ptr<HostKernel>& hk = host_kernels[k.name];
      if (!hk) {
        GF_ASSIGN_OR_RETURN(hk, HostKernel::Build(k));
      }
      std::shared_ptr<const HostKernel> host = hk;
      // A few blocks: grid-stride loops cover the rest (any grid is correct).
      const unsigned grid = k.row_kernel ? static_cast<unsigned>(std::clamp<int64_t>(k.scalar_work_items, 1, 4)) : 2u;
      steps.push_back({label, [host, args, grid](cudaStream_t) -> Status {
                         host->Launch(args, grid);
                         return Status::Ok();
                       }});
      ++stats.launches;
      ++stats.generated;
      return Status::Ok();
    }
    GF_ASSIGN_OR_RETURN(cudaKernel_t kernel, Load(k));
    const int64_t items = k.row_kernel ? k.scalar_work_items
                                       : (k.has_vector_path ? k.vector_work_items : k.scalar_work_items);
    const int64_t blocks = k.row_kernel ? std::clamp<int64_t>(items, 1, int64_t{1} << 20)
                                        : std::clamp<int64_t>((items + kCudaBlockSize - 1) / kCudaBlockSize, 1,
                                                              int64_t{16} * sms);
    // The parameter array cudaLaunchKernel reads, built once: the pointers never change.
    struct Params {
      std::vector<void*> values, addresses;
    };
    auto params = std::make_shared<Params>();
    params->values = std::move(args);
    for (void*& v : params->values) params->addresses.push_back(&v);
    const std::string name = k.name;
    steps.push_back({label, [kernel, blocks, params, name](cudaStream_t s) -> Status {
                       GF_CUDA(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(static_cast<unsigned>(blocks)),
                                                dim3(kCudaBlockSize), params->addresses.data(), 0, s),
                               StrCat("launching ", name));
                       return Status::Ok();
                     }});
    ++stats.launches;
    ++stats.generated;
    return Status::Ok();
  }

  Status PlanGraph(const Graph& g) {
    for (const auto& n : g.nodes()) GF_RETURN_IF_ERROR(PlanNode(*n).WithContext(n->Describe()));
    return Status::Ok();
  }

  // The whole plan: inputs first, every node with pooled buffers, then any output no node wrote.
  Status PlanTop(const Graph& g) {
    for (const Value* v : g.inputs()) GF_RETURN_IF_ERROR(Buffer(v).status());
    for (const Value* v : g.outputs()) pinned.insert(v);
    memory.emplace(g);
    for (const auto& n : g.nodes()) {
      GF_RETURN_IF_ERROR(PlanNode(*n).WithContext(n->Describe()));
      memory->NextNode();
    }
    stats.activation_bytes = memory->plan().peak_bytes;
    stats.activation_bytes_no_reuse = memory->plan().no_reuse_bytes;
    memory.reset();
    for (const Value* v : g.outputs()) GF_RETURN_IF_ERROR(Buffer(v).status());
    return Status::Ok();
  }

  Result<std::vector<void*>> NodeBuffers(const Node& n) {
    std::vector<void*> out;
    for (const Value* v : n.inputs()) {
      if (!v) return Unimplemented("an omitted optional input");
      GF_ASSIGN_OR_RETURN(void* p, Buffer(v));
      out.push_back(p);
    }
    for (const Value* v : n.outputs()) {
      GF_ASSIGN_OR_RETURN(void* p, Buffer(v));
      out.push_back(p);
    }
    return out;
  }

  Status PlanNode(const Node& n) {
    auto plan = PlanNodeForCuda(n, opts.plan);
    if (!plan.ok()) {
      if (const Graph* ref = n.GetGraph("reference")) return PlanReference(n, *ref);
      return PlanHostFallback(n, plan.status());
    }
    switch (plan->path) {
      case CudaPath::kView: {
        GF_ASSIGN_OR_RETURN(void* p, Buffer(n.input(0)));
        if (dev.count(n.output())) {  // a graph output with its own buffer: copy
          void* dst = dev[n.output()];
          const size_t bytes = Bytes(n.output());
          steps.push_back({n.name(), [=, this](cudaStream_t s) {
                             return Copy(dst, p, bytes, cudaMemcpyDeviceToDevice, s);
                           }});
        } else {
          dev[n.output()] = p;
          Alias(n.output(), n.input(0));
        }
        lines.push_back(StrCat(n.name(), ": ", plan->what));
        return Status::Ok();
      }
      case CudaPath::kKernel: {
        GF_ASSIGN_OR_RETURN(std::vector<void*> args, NodeBuffers(n));
        lines.push_back(StrCat(n.name(), ": ", plan->what, " ", plan->kernels[0].name));
        return AddKernelStep(n.name(), plan->kernels[0], std::move(args));
      }
      case CudaPath::kCublas:
      case CudaPath::kCublasThenKernel:
        return PlanGemm(n, *plan);
      case CudaPath::kAttentionGemms:
        return PlanAttentionGemms(n, *plan);
    }
    return Internal("unknown CUDA path");
  }

  // FusedAttention as GEMMs (codegen.h, GenerateAttentionGemmKernels): prep, q k^T, softmax, p v.
  Status PlanAttentionGemms(const Node& n, const CudaNodePlan& plan) {
    const AttentionGemmKernels& a = plan.attention;
    GF_ASSIGN_OR_RETURN(std::vector<void*> bufs, NodeBuffers(n));  // the node's inputs, then its output
    void* out = bufs.back();
    auto scratch = [&](int64_t elements, const char* what) -> Result<float*> {
      GF_ASSIGN_OR_RETURN(void* p, Scratch(static_cast<size_t>(elements) * 4, StrCat(n.name(), " ", what)));
      return static_cast<float*>(p);
    };
    GF_ASSIGN_OR_RETURN(float* qd, scratch(a.qd_elements, "attention q scratch"));
    GF_ASSIGN_OR_RETURN(float* kd, scratch(a.kd_elements, "attention k scratch"));
    GF_ASSIGN_OR_RETURN(float* vd, scratch(a.vd_elements, "attention v scratch"));
    GF_ASSIGN_OR_RETURN(float* sc, scratch(a.scores_elements, "attention scores"));
    std::vector<void*> prep_args = {bufs[0], bufs[1], bufs[2]};
    for (int i : a.rope_inputs) prep_args.push_back(bufs[static_cast<size_t>(i)]);
    prep_args.insert(prep_args.end(), {qd, kd, vd});
    GF_RETURN_IF_ERROR(AddKernelStep(n.name(), a.prep, std::move(prep_args)));
    const std::string where = StrCat(n.name(), " (attention, ", a.heads, " heads of ", a.s, "x", a.sk, ")");
    if (a.scores_elements > 0 && a.d > 0) {
      steps.push_back({n.name(), [=, this](cudaStream_t) {
                         return Gemm(a.s, a.sk, a.d, qd, a.d, a.s * a.d, kd, a.d, a.sk * a.d, sc, a.sk, a.s * a.sk,
                                     a.heads, where + ": q k^T", /*trans_b=*/true);
                       }});
      ++stats.launches, ++stats.cublas;
    } else if (a.scores_elements > 0) {  // d = 0: every score is 0
      steps.push_back({n.name(), [=, this](cudaStream_t s) {
                         return Zero(sc, static_cast<size_t>(a.scores_elements) * 4, s, where);
                       }});
    }
    std::vector<void*> soft_args;
    for (int i : a.mask_inputs) soft_args.push_back(bufs[static_cast<size_t>(i)]);
    soft_args.push_back(sc);
    GF_RETURN_IF_ERROR(AddKernelStep(n.name(), a.softmax, std::move(soft_args)));
    if (a.s * a.dv > 0) {
      float* o = static_cast<float*>(out);
      if (a.sk == 0) {
        const size_t bytes = Bytes(n.output());
        steps.push_back({n.name(), [=, this](cudaStream_t s) { return Zero(o, bytes, s, where); }});
      } else {
        // One call over every head where the output's heads are evenly spaced across batch
        // entries too; else one call per batch entry (its heads are).
        const bool even = a.b == 1 || a.out_head_stride_b == a.h * a.out_head_stride_h;
        const int64_t calls = even ? 1 : a.b, heads_per_call = even ? a.heads : a.h;
        for (int64_t b = 0; b < calls; ++b) {
          steps.push_back({n.name(), [=, this](cudaStream_t) {
                             return Gemm(a.s, a.dv, a.sk, sc + b * a.h * a.s * a.sk, a.sk, a.s * a.sk,
                                         vd + b * a.h * a.sk * a.dv, a.dv, a.sk * a.dv, o + b * a.out_head_stride_b,
                                         a.out_row_stride, a.out_head_stride_h, heads_per_call, where + ": p v");
                           }});
          ++stats.launches, ++stats.cublas;
        }
      }
    }
    lines.push_back(StrCat(n.name(), ": ", plan.what, " ", a.prep.name, ", ", a.softmax.name));
    return Status::Ok();
  }

  Status PlanReference(const Node& n, const Graph& ref) {
    if (ref.inputs().size() != n.inputs().size() || ref.outputs().size() != n.outputs().size())
      return Internal("the reference graph's inputs / outputs do not match the node's");
    for (size_t i = 0; i < ref.inputs().size(); ++i) {
      GF_ASSIGN_OR_RETURN(void* p, Buffer(n.input(i)));
      dev[ref.inputs()[i]] = p;
    }
    std::vector<std::pair<const Value*, const Value*>> copies;  // (node output, reference value)
    for (size_t o = 0; o < ref.outputs().size(); ++o) {
      const Value* r = ref.outputs()[o];
      if (dev.count(r)) {  // a reference input (or a value seen twice) is an output: copy it
        copies.push_back({n.output(o), r});
        continue;
      }
      GF_ASSIGN_OR_RETURN(void* p, Buffer(n.output(o)));
      dev[r] = p;
    }
    lines.push_back(StrCat(n.name(), ": no CUDA kernel of its own; its reference graph of ", ref.num_nodes(),
                           " ops runs instead:"));
    ++stats.reference_graphs;
    GF_RETURN_IF_ERROR(PlanGraph(ref));
    for (const auto& [out, r] : copies) {
      GF_ASSIGN_OR_RETURN(void* dst, Buffer(out));
      void* src = dev[r];
      const size_t bytes = Bytes(out);
      steps.push_back({n.name(), [=, this](cudaStream_t s) {
                         return Copy(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
                       }});
    }
    return Status::Ok();
  }

  // The node's CPU kernel between a download of its inputs and an upload of its outputs.
  Status PlanHostFallback(const Node& n, const Status& why) {
    GF_ASSIGN_OR_RETURN(std::vector<void*> bufs, NodeBuffers(n));
    auto host_in = std::make_shared<std::vector<Tensor>>();
    auto host_out = std::make_shared<std::vector<Tensor>>();
    for (const Value* v : n.inputs()) host_in->push_back(Tensor::Empty(v->dtype(), v->shape()).value());
    for (const Value* v : n.outputs()) host_out->push_back(Tensor::Empty(v->dtype(), v->shape()).value());
    const Node* node = &n;
    steps.push_back({n.name(),
                     [=, this](cudaStream_t s) -> Status {
                       // Copies on the plan's stream (ordered with its kernels), waited for here.
                       std::vector<TensorView> in, out;
                       for (size_t i = 0; i < host_in->size(); ++i) {
                         Tensor& t = (*host_in)[i];
                         GF_RETURN_IF_ERROR(Copy(t.data(), bufs[i], t.nbytes(), cudaMemcpyDeviceToHost, s));
                         in.push_back(t.view());
                       }
                       GF_RETURN_IF_ERROR(Sync(s));
                       for (Tensor& t : *host_out) out.push_back(t.view());
                       GF_RETURN_IF_ERROR(RunNodeOnce(*node, in, out, CpuContext{}));
                       for (size_t o = 0; o < host_out->size(); ++o) {
                         Tensor& t = (*host_out)[o];
                         GF_RETURN_IF_ERROR(Copy(bufs[host_in->size() + o], t.data(), t.nbytes(), cudaMemcpyHostToDevice, s));
                       }
                       return Sync(s);
                     },
                     true});
    ++stats.launches;
    ++stats.host_fallbacks;
    lines.push_back(StrCat(n.name(), ": on the host (", why.message(), ")"));
    return Status::Ok();
  }

  Status PlanGemm(const Node& n, const CudaNodePlan& plan) {
    if (n.op() == "MatMul") return PlanMatMul(n, plan);
    if (n.op() != "FusedGemm") return PlanHostFallback(n, Unimplemented(n.op(), " on the GPU"));
    const Value* a = n.input(0);
    const Value* w = n.input(1);
    if (a->dtype() != DType::kF32 || w->dtype() != DType::kF32)
      return PlanHostFallback(n, Unimplemented("non-f32 GEMM"));
    const int64_t splits = n.GetInt("splits", 1), k = a->shape().back(), nn = w->shape()[1] / splits;
    const int64_t m = k == 0 ? 0 : a->numel() / k;
    const std::vector<int64_t> out_proj = n.GetInts("out_proj");
    GF_ASSIGN_OR_RETURN(void* ap, Buffer(a));
    GF_ASSIGN_OR_RETURN(void* wp, Buffer(w));
    const float* A = static_cast<const float*>(ap);
    const float* W = static_cast<const float*>(wp);
    const std::string where = StrCat(n.name(), " (", m, "x", nn * splits, "x", k, ")");

    if (plan.path == CudaPath::kCublas && plan.cublas_epilogue.kind != CublasLtEpilogue::kNone) {
      if (!emu) {
        const Status lt_plan = PlanCublasLt(n, plan.cublas_epilogue, m, nn, k);
        // cuBLASLt found no algorithm for this shape and epilogue: GEMM + generated epilogue.
        if (lt_plan.ok() || lt_plan.code() != StatusCode::kUnimplemented) return lt_plan;
      }
      // Emulated (or no cuBLASLt algorithm): the same epilogue as a generated kernel.
      CudaNodePlan generic = plan;
      generic.path = CudaPath::kCublasThenKernel;
      generic.what = emu ? "GEMM, then the generated epilogue (cuBLASLt's epilogue on a GPU)"
                         : "cuBLAS GEMM, then the generated epilogue (cuBLASLt had no algorithm)";
      GF_ASSIGN_OR_RETURN(CudaKernelSource ek, GenerateGemmEpilogueKernel(n));
      generic.kernels = {std::move(ek)};
      return PlanGemm(n, generic);
    }

    // Every projection a node output of its own (q/k/v): the outputs get one [S, M, N] block,
    // so that one strided-batched GEMM writes all of them.
    std::vector<float*> dst(static_cast<size_t>(splits), nullptr);
    std::vector<int64_t> ld(static_cast<size_t>(splits), splits * nn);
    // With many rows, one call per projection instead: each fills the GPU alone, and on an H200
    // three 512x4096x4096 calls took 1.15 ms where the batched call took 1.25 ms (at 1 row the
    // batched call was faster, 0.053 against 0.065 ms).
    constexpr int64_t kRowsForOneCallPerProjection = 64;
    bool batched = plan.path == CudaPath::kCublas && splits > 1 && static_cast<int64_t>(out_proj.size()) == splits &&
                   m < kRowsForOneCallPerProjection;
    for (size_t o = 0; o < out_proj.size() && batched; ++o)
      batched = out_proj[o] == static_cast<int64_t>(o) && !dev.count(n.output(o));
    if (batched) {
      GF_ASSIGN_OR_RETURN(void* p, SharedBuffer(n.outputs(), static_cast<size_t>(splits * m * nn) * 4,
                                                StrCat(n.name(), " outputs")));
      for (int64_t s = 0; s < splits; ++s) dev[n.output(static_cast<size_t>(s))] = static_cast<float*>(p) + s * m * nn;
      float* c = static_cast<float*>(p);
      if (m * nn > 0) {
        steps.push_back({n.name(), [=, this](cudaStream_t) {
                           return Gemm(m, nn, k, A, k, 0, W, splits * nn, nn, c, nn, m * nn, splits, where);
                         }});
        ++stats.launches, ++stats.cublas;
      }
      lines.push_back(StrCat(n.name(), ": ", plan.what, " (strided-batched over the ", splits, " projections)"));
      return Status::Ok();
    }
    // Otherwise: projection s goes to the node output that IS it, else the workspace.
    for (size_t o = 0; o < out_proj.size(); ++o)
      if (out_proj[o] >= 0) {
        GF_ASSIGN_OR_RETURN(void* p, Buffer(n.output(o)));
        dst[static_cast<size_t>(out_proj[o])] = static_cast<float*>(p);
        ld[static_cast<size_t>(out_proj[o])] = nn;
      }
    float* ws = nullptr;
    const bool all_in_ws = std::all_of(dst.begin(), dst.end(), [](float* p) { return p == nullptr; });
    if (std::any_of(dst.begin(), dst.end(), [](float* p) { return p == nullptr; })) {
      GF_ASSIGN_OR_RETURN(void* p, Scratch(static_cast<size_t>(m * splits * nn) * 4, StrCat(n.name(), " workspace")));
      ws = static_cast<float*>(p);
      for (int64_t s = 0; s < splits; ++s)
        if (!dst[static_cast<size_t>(s)]) dst[static_cast<size_t>(s)] = ws + s * nn;
    }
    if (m * nn > 0) {
      if (all_in_ws) {  // one GEMM over the concatenated weights
        steps.push_back({n.name(), [=, this](cudaStream_t) {
                           return Gemm(m, splits * nn, k, A, k, 0, W, splits * nn, 0, ws, splits * nn, 0, 1, where);
                         }});
        ++stats.launches, ++stats.cublas;
      } else {
        for (int64_t s = 0; s < splits; ++s) {
          float* c = dst[static_cast<size_t>(s)];
          const int64_t ldc = ld[static_cast<size_t>(s)];
          steps.push_back({n.name(), [=, this](cudaStream_t) {
                             return Gemm(m, nn, k, A, k, 0, W + s * nn, splits * nn, 0, c, ldc, 0, 1, where);
                           }});
          ++stats.launches, ++stats.cublas;
        }
      }
    }
    if (plan.path == CudaPath::kCublas) {
      const bool per_projection = splits > 1 && !all_in_ws;
      lines.push_back(per_projection ? StrCat(n.name(), ": cuBLAS GEMM, one call per projection (", splits, " of ", m, " rows)")
                                     : StrCat(n.name(), ": ", plan.what));
      return Status::Ok();
    }
    // The epilogue kernel: projections, extra inputs, then the epilogue's outputs.
    std::vector<void*> args(dst.begin(), dst.end());
    for (size_t i = 2; i < n.inputs().size(); ++i) {
      GF_ASSIGN_OR_RETURN(void* p, Buffer(n.input(i)));
      args.push_back(p);
    }
    for (size_t o = 0; o < out_proj.size(); ++o)
      if (out_proj[o] < 0) {
        GF_ASSIGN_OR_RETURN(void* p, Buffer(n.output(o)));
        args.push_back(p);
      }
    lines.push_back(StrCat(n.name(), ": ", plan.what, " ", plan.kernels[0].name));
    return AddKernelStep(n.name(), plan.kernels[0], std::move(args));
  }

  Status PlanCublasLt(const Node& n, const CublasLtEpilogue& e, int64_t m, int64_t nn, int64_t k) {
    GF_ASSIGN_OR_RETURN(void* ap, Buffer(n.input(0)));
    GF_ASSIGN_OR_RETURN(void* wp, Buffer(n.input(1)));
    GF_ASSIGN_OR_RETURN(void* bp, Buffer(n.input(static_cast<size_t>(e.bias_input))));
    GF_ASSIGN_OR_RETURN(void* cp, Buffer(n.output(0)));
    const std::string where = StrCat(n.name(), ": cuBLASLt");
    // Column-major D[N,M] = W^T-as-stored [N,K] * A^T-as-stored [K,M]: row-major C[M,N] = A W.
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t wl = nullptr, al = nullptr, cl = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    GF_BLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), where);
    cleanups.push_back([op] { cublasLtMatmulDescDestroy(op); });
    const cublasLtEpilogue_t epi = e.kind == CublasLtEpilogue::kBias       ? CUBLASLT_EPILOGUE_BIAS
                                   : e.kind == CublasLtEpilogue::kReluBias ? CUBLASLT_EPILOGUE_RELU_BIAS
                                                                           : CUBLASLT_EPILOGUE_GELU_BIAS;
    GF_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), where);
    const void* bias = bp;
    GF_BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), where);
    GF_BLAS(cublasLtMatrixLayoutCreate(&wl, CUDA_R_32F, static_cast<uint64_t>(nn), static_cast<uint64_t>(k), nn), where);
    cleanups.push_back([wl] { cublasLtMatrixLayoutDestroy(wl); });
    GF_BLAS(cublasLtMatrixLayoutCreate(&al, CUDA_R_32F, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k), where);
    cleanups.push_back([al] { cublasLtMatrixLayoutDestroy(al); });
    GF_BLAS(cublasLtMatrixLayoutCreate(&cl, CUDA_R_32F, static_cast<uint64_t>(nn), static_cast<uint64_t>(m), nn), where);
    cleanups.push_back([cl] { cublasLtMatrixLayoutDestroy(cl); });
    GF_BLAS(cublasLtMatmulPreferenceCreate(&pref), where);
    cleanups.push_back([pref] { cublasLtMatmulPreferenceDestroy(pref); });
    const uint64_t ws_bytes = blas_workspace_bytes;
    GF_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                 sizeof ws_bytes),
            where);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    GF_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, wl, al, cl, cl, pref, 1, &result, &found), where);
    if (found == 0) return Unimplemented(where, ": no algorithm for this epilogue");
    cublasLtHandle_t handle = lt;
    void* ws = blas_workspace;
    const size_t wsb = blas_workspace_bytes;
    steps.push_back({n.name(), [=](cudaStream_t s) {
                       const float one = 1.f, zero = 0.f;
                       return BlasStatus(cublasLtMatmul(handle, op, &one, wp, wl, ap, al, &zero, cp, cl, cp, cl,
                                                        &result.algo, ws, wsb, s),
                                         where);
                     }});
    ++stats.launches, ++stats.cublas;
    lines.push_back(StrCat(n.name(), ": cuBLASLt GEMM with its ",
                           epi == CUBLASLT_EPILOGUE_BIAS ? "BIAS" : epi == CUBLASLT_EPILOGUE_RELU_BIAS ? "RELU_BIAS" : "GELU_BIAS",
                           " epilogue"));
    return Status::Ok();
  }

  Status PlanMatMul(const Node& n, const CudaNodePlan& plan) {
    const Value* a = n.input(0);
    const Value* b = n.input(1);
    const Value* y = n.output();
    const Shape &as = a->shape(), &bs = b->shape();
    if (a->dtype() != DType::kF32 || b->dtype() != DType::kF32 || as.size() < 2 || bs.size() < 2)
      return PlanHostFallback(n, Unimplemented("MatMul of ", a->TypeString(), " and ", b->TypeString(), " on the GPU"));
    const int64_t m = as[as.size() - 2], k = as.back(), nn = bs.back();
    const Shape a_batch(as.begin(), as.end() - 2), b_batch(bs.begin(), bs.end() - 2);
    int64_t batch = 1, stride_a = m * k, stride_b = k * nn, rows = m;
    for (int64_t d : a_batch) batch *= d;
    if (bs.size() == 2) {  // one GEMM over all rows of A
      rows = batch * m;
      batch = 1;
      stride_b = 0;
    } else if (a_batch == b_batch) {
    } else if (as.size() == 2) {
      batch = 1;
      for (int64_t d : b_batch) batch *= d;
      stride_a = 0;
    } else {
      return PlanHostFallback(n, Unimplemented("MatMul with broadcast batch dims ", a->TypeString(), " x ",
                                               b->TypeString(), " on the GPU"));
    }
    GF_ASSIGN_OR_RETURN(void* ap, Buffer(a));
    GF_ASSIGN_OR_RETURN(void* bp, Buffer(b));
    GF_ASSIGN_OR_RETURN(void* yp, Buffer(y));
    if (y->numel() == 0) return Status::Ok();
    const std::string where = StrCat(n.name(), " (", batch, " x ", rows, "x", nn, "x", k, ")");
    const auto* A = static_cast<const float*>(ap);
    const auto* B = static_cast<const float*>(bp);
    auto* Y = static_cast<float*>(yp);
    if (k == 0) {
      const size_t bytes = Bytes(y);
      steps.push_back({n.name(), [=, this](cudaStream_t s) { return Zero(Y, bytes, s, where); }});
    } else {
      steps.push_back({n.name(), [=, this](cudaStream_t) {
                         return Gemm(rows, nn, k, A, k, stride_a, B, nn, stride_b, Y, nn, rows * nn, batch, where);
                       }});
    }
    ++stats.launches, ++stats.cublas;
    lines.push_back(StrCat(n.name(), ": ", plan.what, batch > 1 ? StrCat(" (", batch, " batched)") : ""));
    return Status::Ok();
  }

  Status Enqueue() {
    if (graph_exec) return CudaStatus(cudaGraphLaunch(graph_exec, stream), "replaying the CUDA graph");
    for (Step& s : steps) GF_RETURN_IF_ERROR(s.run(stream).WithContext(s.label));
    return Status::Ok();
  }
};

CudaExecutor::CudaExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaExecutor::~CudaExecutor() = default;
const CudaExecStats& CudaExecutor::stats() const { return impl_->stats; }
const std::vector<std::string>& CudaExecutor::describe() const { return impl_->lines; }

Result<std::unique_ptr<CudaExecutor>> CudaExecutor::Create(const Graph& g, const CudaExecOptions& options) {
  auto impl = std::make_unique<Impl>();
  Impl& x = *impl;
  x.graph = &g;
  x.opts = options;
  if (options.emulate) {
    if (options.cuda_graph) return InvalidArgument("a CUDA graph cannot be emulated on the host");
    x.emu = true;
    GF_RETURN_IF_ERROR(x.PlanTop(g));
    return std::unique_ptr<CudaExecutor>(new CudaExecutor(std::move(impl)));
  }
  std::string why;
  if (!CudaDeviceAvailable(options.device, &why)) return NotFound(why);
  GF_CUDA(cudaSetDevice(options.device), "cudaSetDevice");
  cudaDeviceProp prop{};
  GF_CUDA(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties");
  x.sms = std::max(1, prop.multiProcessorCount);
  NvrtcOptions nv;
  nv.arch = StrCat("compute_", prop.major, prop.minor);
  nv.cache_dir = options.kernel_cache_dir;
  if (const char* env = std::getenv("GF_KERNEL_CACHE"); nv.cache_dir.empty() && env) nv.cache_dir = env;
  x.compiler = std::make_unique<NvrtcCompiler>(nv);
  GF_CUDA(cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  GF_BLAS(cublasCreate(&x.blas), "cublasCreate");
  GF_BLAS(cublasSetStream(x.blas, x.stream), "cublasSetStream");
  GF_BLAS(cublasLtCreate(&x.lt), "cublasLtCreate");
  GF_ASSIGN_OR_RETURN(x.blas_workspace, x.Alloc(x.blas_workspace_bytes, "the cuBLAS workspace"));
  GF_BLAS(cublasSetWorkspace(x.blas, x.blas_workspace, x.blas_workspace_bytes), "cublasSetWorkspace");

  GF_RETURN_IF_ERROR(x.PlanTop(g));

  if (options.cuda_graph) {
    for (const Step& s : x.steps)
      if (s.host) return Unimplemented("--cuda-graph: node '", s.label, "' runs on the host, which a CUDA graph cannot capture");
    GF_CUDA(cudaStreamBeginCapture(x.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    Status st = x.Enqueue();
    const cudaError_t end = cudaStreamEndCapture(x.stream, &x.cuda_graph);
    GF_RETURN_IF_ERROR(st.WithContext("capturing the plan"));
    GF_CUDA(end, "cudaStreamEndCapture");
    GF_CUDA(cudaGraphInstantiate(&x.graph_exec, x.cuda_graph, 0), "cudaGraphInstantiate");
  }
  return std::unique_ptr<CudaExecutor>(new CudaExecutor(std::move(impl)));
}

Result<std::vector<Tensor>> CudaExecutor::Run(std::span<const TensorView> inputs) {
  Impl& x = *impl_;
  const Graph& g = *x.graph;
  if (inputs.size() != g.inputs().size())
    return InvalidArgument("the graph takes ", g.inputs().size(), " inputs, got ", inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value* v = g.inputs()[i];
    if (inputs[i].dtype != v->dtype() || inputs[i].shape != v->shape())
      return InvalidArgument("input ", i, " ('", v->name(), "') must be ", v->TypeString(), ", got ",
                             DTypeName(inputs[i].dtype), ShapeToString(inputs[i].shape));
    GF_RETURN_IF_ERROR(x.Copy(x.dev.at(v), inputs[i].data, Bytes(v), cudaMemcpyHostToDevice, x.stream)
                           .WithContext(StrCat("uploading input '", v->name(), "'")));
  }
  GF_RETURN_IF_ERROR(x.Enqueue());
  std::vector<Tensor> out;
  for (const Value* v : g.outputs()) {
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(v->dtype(), v->shape()));
    GF_RETURN_IF_ERROR(x.Copy(t.data(), x.dev.at(v), t.nbytes(), cudaMemcpyDeviceToHost, x.stream)
                           .WithContext(StrCat("downloading output '", v->name(), "'")));
    out.push_back(std::move(t));
  }
  GF_RETURN_IF_ERROR(x.Sync(x.stream).WithContext("running the plan"));
  x.ran = true;
  return out;
}

Result<double> CudaExecutor::MedianReplayMs(int repeats, double* median_wall_ms) {
  std::vector<double> ms, wall;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    double w = 0;
    GF_ASSIGN_OR_RETURN(double t, Replay(&w));
    ms.push_back(t);
    wall.push_back(w);
  }
  std::sort(ms.begin(), ms.end());
  std::sort(wall.begin(), wall.end());
  if (median_wall_ms) *median_wall_ms = wall[wall.size() / 2];
  return ms[ms.size() / 2];
}

Result<std::vector<std::pair<std::string, double>>> CudaExecutor::ProfileSteps(int repeats) {
  Impl& x = *impl_;
  if (!x.ran) return InvalidArgument("ProfileSteps before a first Run");
  if (x.emu) return Unimplemented("per-step device times of an emulated plan");
  const size_t n = x.steps.size();
  std::vector<cudaEvent_t> ev(n + 1, nullptr);
  Status st = Status::Ok();
  for (cudaEvent_t& e : ev)
    if (st.ok()) st = CudaStatus(cudaEventCreate(&e), "cudaEventCreate");
  std::vector<std::vector<double>> ms(n);
  for (int r = 0; r < std::max(1, repeats) && st.ok(); ++r) {
    cudaEventRecord(ev[0], x.stream);
    for (size_t i = 0; i < n && st.ok(); ++i) {
      st = x.steps[i].run(x.stream).WithContext(x.steps[i].label);
      cudaEventRecord(ev[i + 1], x.stream);
    }
    if (st.ok()) st = CudaStatus(cudaEventSynchronize(ev[n]), "profiling the plan");
    for (size_t i = 0; i < n && st.ok(); ++i) {
      float t = 0;
      cudaEventElapsedTime(&t, ev[i], ev[i + 1]);
      ms[i].push_back(t);
    }
  }
  for (cudaEvent_t e : ev)
    if (e) cudaEventDestroy(e);
  GF_RETURN_IF_ERROR(st);
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i < n; ++i) {
    std::sort(ms[i].begin(), ms[i].end());
    out.push_back({x.steps[i].label, ms[i][ms[i].size() / 2]});
  }
  return out;
}

Result<double> CudaExecutor::Replay(double* wall_ms) {
  Impl& x = *impl_;
  if (!x.ran) return InvalidArgument("Replay before a first Run");
  auto ms_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  };
  if (x.emu) {  // host time of the emulated plan
    const auto t0 = std::chrono::steady_clock::now();
    GF_RETURN_IF_ERROR(x.Enqueue());
    const double ms = ms_since(t0);
    if (wall_ms) *wall_ms = ms;
    return ms;
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  GF_CUDA(cudaEventCreate(&start), "cudaEventCreate");
  GF_CUDA(cudaEventCreate(&stop), "cudaEventCreate");
  const auto t1 = std::chrono::steady_clock::now();
  cudaEventRecord(start, x.stream);
  Status st = x.Enqueue();
  cudaEventRecord(stop, x.stream);
  const cudaError_t sync = cudaEventSynchronize(stop);
  if (wall_ms) *wall_ms = ms_since(t1);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  GF_RETURN_IF_ERROR(st);
  GF_CUDA(sync, "replaying the plan");
  return static_cast<double>(ms);
}

}  // namespace graphfuse::cuda
