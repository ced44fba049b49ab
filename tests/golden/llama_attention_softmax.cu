
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

extern "C" __global__ void __launch_bounds__(256) attention_softmax_mask_h4_f32_ae250cc9(const float* __restrict__ mask, float* __restrict__ p, const gf::Sizes<6> z) {
  const long long kS = z.v[0];
  const long long kSk = z.v[1];
  const long long kItems = z.v[2];
  const long long ms0 = z.v[3];
  const long long ms2 = z.v[4];
  const long long ms3 = z.v[5];
  constexpr long long kH = 4LL;
  for (long long item = blockIdx.x; item < kItems; item += gridDim.x) {
    const long long r = item % kS, bh = item / kS, h = bh % kH, b = bh / kH;
    (void)r, (void)h, (void)b;
    float* row = p + item * kSk;
    float m = -__int_as_float(0x7f800000);
    for (long long j = threadIdx.x; j < kSk; j += 256) {
      float sc = 0.25f * row[j];
      sc = sc + mask[b * ms0 + r * ms2 + j * ms3];
      row[j] = sc;
      m = gf::max(m, sc);
    }
    m = gf::block_max(m);
    double sum = 0;
    for (long long j = threadIdx.x; j < kSk; j += 256) {
      const float e = expf(row[j] - m);
      row[j] = e;
      sum += e;
    }
    const float inv = static_cast<float>(1.0 / gf::block_sum(sum));
    for (long long j = threadIdx.x; j < kSk; j += 256) row[j] = row[j] * inv;
  }
}
