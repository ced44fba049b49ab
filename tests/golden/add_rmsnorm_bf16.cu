// The op-table rows this kernel uses (graphfuse/ops.def, stringized).
template <class T> __forceinline__ T op_Add(T x, T y, T z, const Attrs& a, long long idx) { return x + y; }

// Block reductions for row kernels (blockDim.x == 256: eight warps). Warp partials by
// shuffles, then the eight partials summed in a fixed order: every thread gets the same value.
__forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = gf::max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__noinline__ double block_sum(double v) {
  __shared__ double part[8];
  v = warp_sum(v);
  __syncthreads();  // the previous reduction's readers are done with part
  if ((threadIdx.x & 31u) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  double t = 0;
  for (int w = 0; w < 8; ++w) t += part[w];
  return t;
}
__noinline__ float block_max(float v) {
  __shared__ float part[8];
  v = warp_max(v);
  __syncthreads();
  if ((threadIdx.x & 31u) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = part[0];
  for (int w = 1; w < 8; ++w) t = gf::max(t, part[w]);
  return t;
}

}  // namespace gf

// One element of group 'fused_norm_0': registers r0.. are the inputs in body order, then one per node.
__forceinline__ void gf_prologue(long long idx, float r0, float r1, float& o0) {
  const gf::Attrs a2{0.0f, 0.0f, 0, 0ull, false};
  float r2 = gf::op_Add<float>(r0, r1, float(0), a2, idx);  // Add_0
  r2 = gf::round_bf16(r2);  // the unfused op stores bf16
  o0 = r2;
}

extern "C" __global__ void __launch_bounds__(256) fused_add_rmsnorm_bf16_979e6377(const gf::bf16* __restrict__ in0, const gf::bf16* __restrict__ in1, const gf::bf16* __restrict__ in2, gf::bf16* __restrict__ out0, gf::bf16* __restrict__ out1, const gf::Sizes<2> z) {
  const long long kRows = z.v[0];
  const long long kD = z.v[1];
  constexpr int kPer = 16;
  for (long long row = blockIdx.x; row < kRows; row += gridDim.x) {
    float x[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const long long c = threadIdx.x + j * 256LL, i = row * kD + c;
      x[j] = 0.f;
      if (c >= kD) continue;
      float q0;
      gf_prologue(i, gf::f32_of(in0[i]), gf::f32_of(in1[i]), q0);
      gf::store(out1 + i, q0);
      x[j] = q0;
    }
    double ss = 0;
    for (int j = 0; j < kPer; ++j) ss += static_cast<double>(x[j]) * x[j];  // padding lanes hold 0
    ss = gf::block_sum(ss);
    const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(kD) + static_cast<double>(1e-06f)));
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const long long c = threadIdx.x + j * 256LL, i = row * kD + c;
      if (c >= kD) continue;
      gf::store(out0 + i, x[j] * inv * gf::f32_of(in2[c]));
    }
  }
}
