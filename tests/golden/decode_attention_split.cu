
}  // namespace gf

extern "C" __global__ void __launch_bounds__(256) decode_attention_split_rope_mask_h8_kv2_d64_f32_969f8325(const float* __restrict__ q, const float* __restrict__ k_new, const float* __restrict__ v_new, const float* __restrict__ past_k, const float* __restrict__ past_v, const float* __restrict__ mask, const float* __restrict__ cs, const float* __restrict__ sn, float* __restrict__ present_k, float* __restrict__ present_v, float* __restrict__ part, const gf::Sizes<24> z) {
  const long long kP = z.v[0];
  const long long kSk = z.v[1];
  const long long kChunk = z.v[2];
  const long long kSplits = z.v[3];
  const long long kT = z.v[4];
  const long long kItems = z.v[5];
  const long long q_sb = z.v[6];
  const long long q_sh = z.v[7];
  const long long q_sr = z.v[8];
  const long long cq0 = z.v[9];
  const long long cq2 = z.v[10];
  const long long cq3 = z.v[11];
  const long long k_sb = z.v[12];
  const long long k_sh = z.v[13];
  const long long k_sr = z.v[14];
  const long long ck0 = z.v[15];
  const long long ck2 = z.v[16];
  const long long ck3 = z.v[17];
  const long long ms0 = z.v[18];
  const long long ms2 = z.v[19];
  const long long ms3 = z.v[20];
  const long long v_sb = z.v[21];
  const long long v_sh = z.v[22];
  const long long v_sr = z.v[23];
  constexpr long long kKv = 2LL, kG = 4LL, kS = 1LL, kD = 64LL, kDv = 64LL, kHalf = 32LL;
  constexpr long long kR = 4LL, kChunkCap = 512LL, kTileCap = 31LL, kTs = kD + 1, kStat = 32LL;
  __shared__ float qs[kR * kD];         // the block's query rows, roped
  __shared__ float ks[kTileCap * kTs];  // a tile of keys, rows padded by one
  __shared__ float ps[kR * kChunkCap];  // scores, then exponentials, of the chunk
  __shared__ float rmax[256];
  __shared__ double rsum[256];
  const long long tid = threadIdx.x;
  for (long long item = blockIdx.x; item < kItems; item += gridDim.x) {
    const long long split = item % kSplits, bk = item / kSplits, kh = bk % kKv, b = bk / kKv;
    const long long j0 = split * kChunk, len = gf::min(kChunk, kSk - j0);
    __syncthreads();  // the previous item's readers are done with qs, ps and the statistics
    for (long long i = tid; i < kR * kD; i += 256) {
      const long long c = i % kD, rr = i / kD, r = rr % kS, h = kh * kG + rr / kS;
      const float* qh = q + b * q_sb + h * q_sh + r * q_sr;
      const long long co = b * cq0 + r * cq2 + c * cq3;
      const float x2 = c < kHalf ? -gf::f32_of(qh[c + kHalf]) : gf::f32_of(qh[c - kHalf]);
      const float a = gf::f32_of(qh[c]) * cs[co];
      const float s = x2 * sn[co];
      qs[i] = a + s;
    }
    const float* kn = k_new + b * k_sb + kh * k_sh;
    for (long long t0 = 0; t0 < len; t0 += kT) {
      const long long tn = gf::min(kT, len - t0);
      __syncthreads();  // qs is written; the previous tile's readers are done with ks
      for (long long i = tid; i < tn * kD; i += 256) {
        const long long c = i % kD, jj = i / kD, j = j0 + t0 + jj;
        float x;
        if (j < kP) {
          x = gf::f32_of(past_k[(bk * kP + j) * kD + c]);
        } else {
          const long long n = j - kP;
          const float* kr = kn + n * k_sr;
          const long long co = b * ck0 + n * ck2 + c * ck3;
          const float x2 = c < kHalf ? -gf::f32_of(kr[c + kHalf]) : gf::f32_of(kr[c - kHalf]);
          const float a = gf::f32_of(kr[c]) * cs[co];
          const float s = x2 * sn[co];
          x = a + s;
        }
        ks[jj * kTs + c] = x;
        gf::store(&present_k[(bk * kSk + j) * kD + c], x);
      }
      __syncthreads();
      for (long long i = tid; i < tn * kR; i += 256) {
        const long long jj = i % tn, rr = i / tn, r = rr % kS, h = kh * kG + rr / kS, j = j0 + t0 + jj;
        (void)r, (void)h;
        const float* qr = qs + rr * kD;
        const float* kr = ks + jj * kTs;
        float acc = 0.f;
        for (long long c = 0; c < kD; ++c) acc += qr[c] * kr[c];
        float sc = 0.125f * acc;
        sc = sc + gf::f32_of(mask[b * ms0 + r * ms2 + j * ms3]);
        ps[rr * kChunk + t0 + jj] = sc;
      }
    }
    __syncthreads();
    const long long srow = tid / kStat, sl = tid % kStat;
    const bool stats = srow < kR;
    float m = -__int_as_float(0x7f800000);
    if (stats)
      for (long long jj = sl; jj < len; jj += kStat) m = gf::max(m, ps[srow * kChunk + jj]);
    rmax[tid] = m;
    __syncthreads();
    if (stats) {
      m = rmax[srow * kStat];
      for (long long u = 1; u < kStat; ++u) m = gf::max(m, rmax[srow * kStat + u]);
      const float mr = m == -__int_as_float(0x7f800000) ? 0.f : m;  // all -inf: every exponential is 0
      double sum = 0;
      for (long long jj = sl; jj < len; jj += kStat) {
        const float e = expf(ps[srow * kChunk + jj] - mr);
        ps[srow * kChunk + jj] = e;
        sum += e;
      }
      rsum[tid] = sum;
    }
    __syncthreads();  // also orders the exponentials' writes before the reads below
    float* pi = part + item * kR * (kDv + 2);
    if (stats && sl == 0) {
      double l = 0;
      for (long long u = 0; u < kStat; ++u) l += rsum[srow * kStat + u];
      pi[srow * (kDv + 2)] = m;
      pi[srow * (kDv + 2) + 1] = static_cast<float>(l);
    }
    const float* vn = v_new + b * v_sb + kh * v_sh;
    for (long long i = tid; i < kR * kDv; i += 256) {
      const long long c = i % kDv, rr = i / kDv;
      const float* pr = ps + rr * kChunk;
      float o = 0.f;
      for (long long jj = 0; jj < len; ++jj) {
        const long long j = j0 + jj;
        const float x = j < kP ? gf::f32_of(past_v[(bk * kP + j) * kDv + c]) : gf::f32_of(vn[(j - kP) * v_sr + c]);
        if (rr == 0) gf::store(&present_v[(bk * kSk + j) * kDv + c], x);
        o += pr[jj] * x;
      }
      pi[rr * (kDv + 2) + 2 + c] = o;
    }
  }
}
