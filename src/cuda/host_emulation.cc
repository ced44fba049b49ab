#include "cuda/host_emulation.h"

#include <filesystem>

#include "cuda/codegen_internal.h"
#include "core/shared_object.h"

namespace graphfuse::cuda {
namespace {

// Part of the shared objects' names: bump when the shim changes, so that none built with an
// older one is reused.
constexpr const char* kShimVersion = "_h2";

constexpr const char* kShim = R"SHIM(
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct alignas(16) float4 { float x, y, z, w; };
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static std::barrier<>* g_barrier = nullptr;
#define __global__
#define __launch_bounds__(n)
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __shared__ static
static inline void __syncthreads() { g_barrier->arrive_and_wait(); }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline float __ldcg(const float* p) { float v; __atomic_load(p, &v, __ATOMIC_RELAXED); return v; }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
static double g_shfl_d[1024];
static float g_shfl_f[1024];
static inline double __shfl_xor_sync(unsigned, double v, int o) {
  g_shfl_d[threadIdx.x] = v; __syncthreads(); const double r = g_shfl_d[threadIdx.x ^ o]; __syncthreads(); return r;
}
static inline float __shfl_xor_sync(unsigned, float v, int o) {
  g_shfl_f[threadIdx.x] = v; __syncthreads(); const float r = g_shfl_f[threadIdx.x ^ o]; __syncthreads(); return r;
}
static inline unsigned short host_f16_bits(float x) { _Float16 h = static_cast<_Float16>(x); unsigned short b; std::memcpy(&b, &h, 2); return b; }
static inline float host_f16_value(unsigned short b) { _Float16 h; std::memcpy(&h, &b, 2); return static_cast<float>(h); }
static inline unsigned short host_bf16_bits(float x) {
  unsigned u; std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
}
)SHIM";

// The CUDA-only lines of the prelude, and their host stand-ins.
const std::pair<const char*, const char*> kHostLines[] = {
    {"__forceinline__ unsigned short f16_bits(float x) {",
     "__forceinline__ unsigned short f16_bits(float x) { return host_f16_bits(x); }"},
    {"__forceinline__ float f16_value(unsigned short h) {",
     "__forceinline__ float f16_value(unsigned short h) { return host_f16_value(h); }"},
    {"__forceinline__ unsigned short bf16_bits(float x) {",
     "__forceinline__ unsigned short bf16_bits(float x) { return host_bf16_bits(x); }"},
};

}  // namespace

Result<std::shared_ptr<HostKernel>> HostKernel::Build(const CudaKernelSource& k, const std::string& root) {
  std::string src = k.source;
  for (const auto& [prefix, host] : kHostLines) {
    const size_t at = src.find(prefix);
    if (at == std::string::npos) return Internal("the prelude has no line starting '", prefix, "'");
    src.replace(at, src.find('\n', at) - at, host);
  }
  std::string call = StrCat(k.name, "(");
  size_t a = 0;
  for (DType t : k.input_dtypes) call += StrCat(a ? ", " : "", "static_cast<const ", internal::StorageType(t), "*>(args[", a, "])"), ++a;
  for (DType t : k.output_dtypes) call += StrCat(a ? ", " : "", "static_cast<", internal::StorageType(t), "*>(args[", a, "])"), ++a;
  if (!k.sizes.empty()) call += StrCat(a ? ", " : "", "*static_cast<const gf::Sizes<", k.sizes.size(), ">*>(args[", a, "])");
  call += ")";
  src = kShim + src + StrCat(R"(
extern "C" void gf_host_launch(void** args, unsigned grid, unsigned block) {
gridDim.x = grid;
blockDim.x = block;
for (unsigned b = 0; b < grid; ++b) {
  std::barrier<> bar(block);
  g_barrier = &bar;
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < block; ++t)
    threads.emplace_back([=] { threadIdx.x = t; blockIdx.x = b; )", call, R"(; });
  for (auto& th : threads) th.join();
}
}
)");
  const std::filesystem::path dir =
      root.empty() ? std::filesystem::temp_directory_path() / "graphfuse_host_emulation" : std::filesystem::path(root);
  GF_ASSIGN_OR_RETURN(std::filesystem::path so,
                      BuildSharedObject(src, "c++ -std=c++20 -O1 -march=native -ffp-contract=off -fPIC -shared -w", dir,
                                        k.name + kShimVersion));
  std::shared_ptr<HostKernel> h(new HostKernel());
  GF_ASSIGN_OR_RETURN(h->so_, SharedObject::Open(so));
  GF_ASSIGN_OR_RETURN(void* launch, h->so_->Symbol("gf_host_launch"));
  h->launch_ = reinterpret_cast<void (*)(void**, unsigned, unsigned)>(launch);
  return h;
}

void HostKernel::Launch(std::vector<void*> args, const std::vector<int64_t>& sizes, unsigned grid,
                        unsigned block) const {
  args.push_back(const_cast<int64_t*>(sizes.data()));  // read as the kernel's gf::Sizes<N>
  launch_(args.data(), grid, block);
}

}  // namespace graphfuse::cuda
