
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

extern "C" __global__ void __launch_bounds__(256) attention_rope_mask_h4_d16_f32_f363b169(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, const float* __restrict__ mask, const float* __restrict__ cs, const float* __restrict__ sn, float* __restrict__ out, const gf::Sizes<24> z) {
  const long long kS = z.v[0];
  const long long kSk = z.v[1];
  const long long kItems = z.v[2];
  const long long q_sb = z.v[3];
  const long long q_sh = z.v[4];
  const long long q_sr = z.v[5];
  const long long k_sb = z.v[6];
  const long long k_sh = z.v[7];
  const long long v_sb = z.v[8];
  const long long v_sh = z.v[9];
  const long long o_sb = z.v[10];
  const long long o_sh = z.v[11];
  const long long o_sr = z.v[12];
  const long long cq0 = z.v[13];
  const long long cq2 = z.v[14];
  const long long cq3 = z.v[15];
  const long long k_sr = z.v[16];
  const long long ck0 = z.v[17];
  const long long ck2 = z.v[18];
  const long long ck3 = z.v[19];
  const long long ms0 = z.v[20];
  const long long ms2 = z.v[21];
  const long long ms3 = z.v[22];
  const long long v_sr = z.v[23];
  constexpr long long kH = 4LL, kD = 16LL, kDv = 16LL, kHalf = 8LL;
  __shared__ float qs[16];
  __shared__ float ps[8192];
  for (long long item = blockIdx.x; item < kItems; item += gridDim.x) {
    const long long r = item % kS, bh = item / kS, h = bh % kH, b = bh / kH;
    const float* qh = q + b * q_sb + h * q_sh + r * q_sr;
    const float* kh = k + b * k_sb + h * k_sh;
    const float* vh = v + b * v_sb + h * v_sh;
    float* oh = out + b * o_sb + h * o_sh + r * o_sr;
    __syncthreads();  // the previous row's readers are done with qs and ps
    for (long long c = threadIdx.x; c < kD; c += 256) {
      const long long co = b * cq0 + r * cq2 + c * cq3;
      const float x2 = c < kHalf ? -qh[c + kHalf] : qh[c - kHalf];
      const float a = qh[c] * cs[co];
      const float s = x2 * sn[co];
      qs[c] = a + s;
    }
    __syncthreads();
    float m = -__int_as_float(0x7f800000);
    for (long long j = threadIdx.x; j < kSk; j += 256) {
      float acc = 0.f;
      const float* kr = kh + j * k_sr;
      const long long co = b * ck0 + j * ck2;
      for (long long c = 0; c < kD; ++c) {
        const float x2 = c < kHalf ? -kr[c + kHalf] : kr[c - kHalf];
        const float a = kr[c] * cs[co + c * ck3];
        const float s = x2 * sn[co + c * ck3];
        acc += qs[c] * (a + s);
      }
      float sc = 0.25f * acc;
      sc = sc + mask[b * ms0 + r * ms2 + j * ms3];
      ps[j] = sc;
      m = gf::max(m, sc);
    }
    m = gf::block_max(m);
    double sum = 0;
    for (long long j = threadIdx.x; j < kSk; j += 256) {
      const float e = expf(ps[j] - m);
      ps[j] = e;
      sum += e;
    }
    const float inv = static_cast<float>(1.0 / gf::block_sum(sum));  // also orders ps's writes before the reads
    for (long long c = threadIdx.x; c < kDv; c += 256) {
      float o = 0.f;
      for (long long j = 0; j < kSk; ++j) o += ps[j] * vh[j * v_sr + c];
      oh[c] = o * inv;
    }
  }
}
