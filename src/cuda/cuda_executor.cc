// CudaExecutor: Create plans every node (its buffers in device_memory.h, its steps by path:
// generated kernels in plan_builder.h, GEMMs in cuda_gemm_plan.h, attention as GEMMs and the
// decode attention's two kernels in cuda_attention_plan.h, the rest on the host in host_fallback.h) and captures the plan as a
// CUDA graph if asked; Run, Replay and ProfileSteps launch the steps.
#include "cuda/cuda_executor.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "cuda/cuda_attention_plan.h"
#include "cuda/cuda_gemm_plan.h"
#include "cuda/cuda_status.h"
#include "cuda/host_fallback.h"
#include "cuda/nvrtc_compile.h"
#include "cuda/plan_builder.h"

namespace graphfuse::cuda {

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
  Impl(const Graph& g, const CudaExecOptions& options) : graph(&g), opts(options), pb(options.emulate) {
    pb.kernel_cache = options.kernels ? options.kernels : std::make_shared<KernelCache>();
  }
  ~Impl() {
    if (pb.stream) cudaStreamSynchronize(pb.stream);
    if (graph_exec) cudaGraphExecDestroy(graph_exec);
    if (cuda_graph) cudaGraphDestroy(cuda_graph);
  }

  const Graph* graph;
  CudaExecOptions opts;
  PlanBuilder pb;
  cudaGraph_t cuda_graph = nullptr;
  cudaGraphExec_t graph_exec = nullptr;
  bool ran = false;

  // The whole plan: inputs first, every node with pooled buffers, then any output no node wrote.
  Status PlanTop(const Graph& g) {
    for (const Value* v : g.inputs()) GF_RETURN_IF_ERROR(pb.memory.Buffer(v).status());
    pb.memory.BeginPooling(g);
    for (const auto& n : g.nodes()) {
      GF_RETURN_IF_ERROR(PlanNode(*n).WithContext(n->Describe()));
      pb.memory.NextNode();
    }
    pb.memory.EndPooling();
    for (const Value* v : g.outputs()) GF_RETURN_IF_ERROR(pb.memory.Buffer(v).status());
    pb.stats.device_bytes = pb.memory.device_bytes();
    pb.stats.activation_bytes = pb.memory.activation_bytes();
    pb.stats.activation_bytes_no_reuse = pb.memory.activation_bytes_no_reuse();
    return Status::Ok();
  }

  Status PlanGraph(const Graph& g) {
    for (const auto& n : g.nodes()) GF_RETURN_IF_ERROR(PlanNode(*n).WithContext(n->Describe()));
    return Status::Ok();
  }

  // One node by its path (PlanNodeForCuda); a node with none runs its reference graph if it has
  // one, else on the host.
  Status PlanNode(const Node& n) {
    auto plan = PlanNodeForCuda(n, opts.plan);
    if (!plan.ok()) {
      if (const Graph* ref = n.GetGraph("reference")) return PlanReference(n, *ref);
      return PlanHostFallback(pb, n, plan.status());
    }
    switch (plan->path) {
      case CudaPath::kView: {
        GF_ASSIGN_OR_RETURN(void* p, pb.memory.Buffer(n.input(0)));
        if (pb.memory.Has(n.output())) {  // a graph output with its own buffer: copy
          void* dst = pb.memory.At(n.output());
          const size_t bytes = ValueBytes(n.output());
          const DeviceMemory* mem = &pb.memory;
          pb.steps.push_back(
              {n.name(), [=](cudaStream_t s) { return mem->Copy(dst, p, bytes, cudaMemcpyDeviceToDevice, s); }});
        } else {
          pb.memory.Bind(n.output(), p);
          pb.memory.Alias(n.output(), n.input(0));
        }
        pb.lines.push_back(StrCat(n.name(), ": ", plan->what));
        return Status::Ok();
      }
      case CudaPath::kKernel: {
        GF_ASSIGN_OR_RETURN(std::vector<void*> args, pb.NodeBuffers(n));
        pb.lines.push_back(StrCat(n.name(), ": ", plan->what, " ", plan->kernels[0].name));
        return pb.AddKernelStep(n.name(), plan->kernels[0], std::move(args));
      }
      case CudaPath::kCublas:
      case CudaPath::kCublasThenKernel:
        return PlanGemm(pb, n, *plan);
      case CudaPath::kAttentionGemms:
        return PlanAttentionGemms(pb, n, *plan);
      case CudaPath::kDecodeAttention:
        return PlanDecodeAttention(pb, n, *plan);
    }
    return Internal("unknown CUDA path");
  }

  // A fused node without a kernel of its own: its reference graph's nodes, each by its own path,
  // reading the node's inputs and writing its outputs.
  Status PlanReference(const Node& n, const Graph& ref) {
    if (ref.inputs().size() != n.inputs().size() || ref.outputs().size() != n.outputs().size())
      return Internal("the reference graph's inputs / outputs do not match the node's");
    for (size_t i = 0; i < ref.inputs().size(); ++i) {
      GF_ASSIGN_OR_RETURN(void* p, pb.memory.Buffer(n.input(i)));
      pb.memory.Bind(ref.inputs()[i], p);
    }
    std::vector<std::pair<const Value*, const Value*>> copies;  // (node output, reference value)
    for (size_t o = 0; o < ref.outputs().size(); ++o) {
      const Value* r = ref.outputs()[o];
      if (pb.memory.Has(r)) {  // a reference input (or a value seen twice) is an output: copy it
        copies.push_back({n.output(o), r});
        continue;
      }
      GF_ASSIGN_OR_RETURN(void* p, pb.memory.Buffer(n.output(o)));
      pb.memory.Bind(r, p);
    }
    pb.lines.push_back(StrCat(n.name(), ": no CUDA kernel of its own; its reference graph of ", ref.num_nodes(),
                              " ops runs instead:"));
    ++pb.stats.reference_graphs;
    GF_RETURN_IF_ERROR(PlanGraph(ref));
    const DeviceMemory* mem = &pb.memory;
    for (const auto& [out, r] : copies) {
      GF_ASSIGN_OR_RETURN(void* dst, pb.memory.Buffer(out));
      void* src = pb.memory.At(r);
      const size_t bytes = ValueBytes(out);
      pb.steps.push_back(
          {n.name(), [=](cudaStream_t s) { return mem->Copy(dst, src, bytes, cudaMemcpyDeviceToDevice, s); }});
    }
    return Status::Ok();
  }

  Status Enqueue() {
    if (graph_exec) return CudaStatus(cudaGraphLaunch(graph_exec, pb.stream), "replaying the CUDA graph");
    for (Step& s : pb.steps) GF_RETURN_IF_ERROR(s.run(pb.stream).WithContext(s.label));
    return Status::Ok();
  }
};

CudaExecutor::CudaExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaExecutor::~CudaExecutor() = default;
const CudaExecStats& CudaExecutor::stats() const { return impl_->pb.stats; }
const std::vector<std::string>& CudaExecutor::describe() const { return impl_->pb.lines; }

Result<std::unique_ptr<CudaExecutor>> CudaExecutor::Create(const Graph& g, const CudaExecOptions& options) {
  auto impl = std::make_unique<Impl>(g, options);
  Impl& x = *impl;
  PlanBuilder& pb = x.pb;
  pb.tf32 = options.plan.tf32;
  if (options.emulate) {
    if (options.cuda_graph) return InvalidArgument("a CUDA graph cannot be emulated on the host");
    GF_RETURN_IF_ERROR(x.PlanTop(g));
    return std::unique_ptr<CudaExecutor>(new CudaExecutor(std::move(impl)));
  }
  std::string why;
  if (!CudaDeviceAvailable(options.device, &why)) return NotFound(why);
  GF_CUDA(cudaSetDevice(options.device), "cudaSetDevice");
  cudaDeviceProp prop{};
  GF_CUDA(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties");
  pb.sms = std::max(1, prop.multiProcessorCount);
  x.opts.plan.decode.sms = pb.sms;  // the decode attention's splits fill this device
  NvrtcOptions nv;
  nv.arch = StrCat("compute_", prop.major, prop.minor);
  nv.cache_dir = options.kernel_cache_dir;
  if (const char* env = std::getenv("GF_KERNEL_CACHE"); nv.cache_dir.empty() && env) nv.cache_dir = env;
  pb.compiler = &pb.kernel_cache->Nvrtc(nv);
  GF_CUDA(cudaStreamCreateWithFlags(&pb.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  pb.memory.set_stream(pb.stream);
  GF_BLAS(cublasCreate(&pb.blas), "cublasCreate");
  GF_BLAS(cublasSetStream(pb.blas, pb.stream), "cublasSetStream");
  GF_BLAS(cublasLtCreate(&pb.lt), "cublasLtCreate");
  GF_ASSIGN_OR_RETURN(pb.blas_workspace, pb.memory.Alloc(pb.blas_workspace_bytes, "the cuBLAS workspace"));
  GF_BLAS(cublasSetWorkspace(pb.blas, pb.blas_workspace, pb.blas_workspace_bytes), "cublasSetWorkspace");

  GF_RETURN_IF_ERROR(x.PlanTop(g));

  if (options.cuda_graph) {
    for (const Step& s : pb.steps)
      if (s.host)
        return Unimplemented("--cuda-graph: node '", s.label, "' runs on the host, which a CUDA graph cannot capture");
    GF_CUDA(cudaStreamBeginCapture(pb.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    Status st = x.Enqueue();
    const cudaError_t end = cudaStreamEndCapture(pb.stream, &x.cuda_graph);
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
    GF_RETURN_IF_ERROR(
        x.pb.memory.Copy(x.pb.memory.At(v), inputs[i].data, ValueBytes(v), cudaMemcpyHostToDevice, x.pb.stream)
            .WithContext(StrCat("uploading input '", v->name(), "'")));
  }
  GF_RETURN_IF_ERROR(x.Enqueue());
  std::vector<Tensor> out;
  for (const Value* v : g.outputs()) {
    GF_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(v->dtype(), v->shape()));
    GF_RETURN_IF_ERROR(x.pb.memory.Copy(t.data(), x.pb.memory.At(v), t.nbytes(), cudaMemcpyDeviceToHost, x.pb.stream)
                           .WithContext(StrCat("downloading output '", v->name(), "'")));
    out.push_back(std::move(t));
  }
  GF_RETURN_IF_ERROR(x.pb.memory.Sync(x.pb.stream).WithContext("running the plan"));
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
  if (x.pb.emu) return Unimplemented("per-step device times of an emulated plan");
  const size_t n = x.pb.steps.size();
  std::vector<cudaEvent_t> ev(n + 1, nullptr);
  Status st = Status::Ok();
  for (cudaEvent_t& e : ev)
    if (st.ok()) st = CudaStatus(cudaEventCreate(&e), "cudaEventCreate");
  std::vector<std::vector<double>> ms(n);
  for (int r = 0; r < std::max(1, repeats) && st.ok(); ++r) {
    cudaEventRecord(ev[0], x.pb.stream);
    for (size_t i = 0; i < n && st.ok(); ++i) {
      st = x.pb.steps[i].run(x.pb.stream).WithContext(x.pb.steps[i].label);
      cudaEventRecord(ev[i + 1], x.pb.stream);
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
    out.push_back({x.pb.steps[i].label, ms[i][ms[i].size() / 2]});
  }
  return out;
}

Result<std::vector<StepTiming>> CudaExecutor::DeviceSteps(int64_t start_ns) {
  GF_ASSIGN_OR_RETURN(auto steps, ProfileSteps(1));
  std::vector<StepTiming> out;
  int64_t at = start_ns;
  for (const auto& [label, ms] : steps) {
    out.push_back(StepTiming{nullptr, label, at, static_cast<int64_t>(ms * 1e6), true});
    at += out.back().duration_ns;
  }
  return out;
}

Result<double> CudaExecutor::Replay(double* wall_ms) {
  Impl& x = *impl_;
  if (!x.ran) return InvalidArgument("Replay before a first Run");
  auto ms_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  };
  if (x.pb.emu) {  // host time of the emulated plan
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
  cudaEventRecord(start, x.pb.stream);
  Status st = x.Enqueue();
  cudaEventRecord(stop, x.pb.stream);
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
