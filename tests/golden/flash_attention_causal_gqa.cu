
}  // namespace gf

extern "C" __global__ void __launch_bounds__(256) flash_attention_rope_mask_h4_kv2_d64_br32_bc32_causal_f32_970f426d(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, const float* __restrict__ mask, const float* __restrict__ cs, const float* __restrict__ sn, float* __restrict__ out, const gf::Sizes<24> z) {
  const long long kS = z.v[0];
  const long long kSk = z.v[1];
  const long long kItems = z.v[2];
  const long long kQtiles = z.v[3];
  const long long q_sb = z.v[4];
  const long long q_sh = z.v[5];
  const long long k_sb = z.v[6];
  const long long k_sh = z.v[7];
  const long long v_sb = z.v[8];
  const long long v_sh = z.v[9];
  const long long o_sb = z.v[10];
  const long long o_sh = z.v[11];
  const long long q_sr = z.v[12];
  const long long k_sr = z.v[13];
  const long long cq2 = z.v[14];
  const long long cq3 = z.v[15];
  const long long kOff = z.v[16];
  const long long ck2 = z.v[17];
  const long long ck3 = z.v[18];
  const long long v_sr = z.v[19];
  const long long ms0 = z.v[20];
  const long long ms2 = z.v[21];
  const long long ms3 = z.v[22];
  const long long o_sr = z.v[23];
  constexpr long long kH = 4LL, kD = 64LL, kDv = 64LL, kHalf = 32LL;
  constexpr int kBr = 32, kBc = 32, kTpr = 8, kAcc = 8;
  __shared__ float qs[kBr * (kD + 1)];
  __shared__ float ks[kBc * (kD + 1)];
  __shared__ float vs[kBc * kDv];
  __shared__ float ps[kBr * (kBc + 1)];
  __shared__ float pmax[kBr * kTpr];
  __shared__ double psum[kBr * kTpr];
  __shared__ float kmax[kD];
  __shared__ int skip;
  const int tid = threadIdx.x, i = tid / kTpr, lane = tid % kTpr;
  const float kNegInf = -__int_as_float(0x7f800000);
  for (long long item = blockIdx.x; item < kItems; item += gridDim.x) {
    const long long qt = item % kQtiles, bh = item / kQtiles, h = bh % kH, b = bh / kH;
    const long long r0 = qt * kBr, r = r0 + i;
    const bool rv = r < kS;
    const float* qh = q + b * q_sb + h * q_sh;
    const float* kh = k + b * k_sb + (h / 2LL) * k_sh;
    const float* vh = v + b * v_sb + (h / 2LL) * v_sh;
    float* oh = out + b * o_sb + h * o_sh;
    __syncthreads();  // the previous tile's readers are done with the shared arrays
    for (int e = tid; e < kBr * kD; e += 256) {
      const long long rq = r0 + e / kD, c = e % kD;
      float x = 0.f;
      if (rq < kS) {
        const long long co = rq * cq2 + c * cq3;
        const float x2 = c < kHalf ? -qh[rq * q_sr + c + kHalf] : qh[rq * q_sr + c - kHalf];
        const float a = qh[rq * q_sr + c] * cs[co];
        const float s = x2 * sn[co];
        x = a + s;
      }
      qs[(e / kD) * (kD + 1) + c] = x;
    }
    float m = kNegInf, acc[kAcc];
    double l = 0;
    for (int u = 0; u < kAcc; ++u) acc[u] = 0.f;
    const long long rlast = (r0 + kBr < kS ? r0 + kBr : kS) - 1, live = rlast + 1 + kOff;
    const long long kend = live < 0 ? 0 : live > kSk ? kSk : live;  // keys from kend on: dropped by every row
    for (long long j0 = 0; j0 < kSk; j0 += kBc) {
      __syncthreads();  // the previous key tile's readers are done with ks, vs, ps
      for (int e = tid; e < kBc * kD; e += 256) {
        const int jj = e / kD;
        const long long c = e % kD, j = j0 + jj;
        float x = 0.f;
        if (j < kSk) {
          const long long co = j * ck2 + c * ck3;
          const float x2 = c < kHalf ? -kh[j * k_sr + c + kHalf] : kh[j * k_sr + c - kHalf];
          const float a = kh[j * k_sr + c] * cs[co];
          const float s = x2 * sn[co];
          x = a + s;
        }
        ks[jj * (kD + 1) + c] = x;
      }
      for (int e = tid; e < kBc * kDv; e += 256) {
        const long long j = j0 + e / kDv, c = e % kDv;
        vs[e] = j < kSk ? vh[j * v_sr + c] : 0.f;
      }
      if (tid == 0) skip = 1;
      __syncthreads();
      if (j0 >= kend) {
        const int valid = kSk - j0 < kBc ? static_cast<int>(kSk - j0) : kBc;
        for (int e = tid; e < valid * kDv; e += 256)
          if (!(vs[e] * 0.f == 0.f)) skip = 0;  // inf or NaN
        for (int c = tid; c < kD; c += 256) {
          float km = 0.f;
          for (int jj = 0; jj < valid; ++jj) {
            const float x = fabsf(ks[jj * (kD + 1) + c]);
            km = x > km || x != x ? x : km;  // NaN sticks
          }
          kmax[c] = km;
        }
        __syncthreads();
        if (lane == 0 && rv) {
          double bound = 0;
          for (long long c = 0; c < kD; ++c)
            bound += static_cast<double>(fabsf(qs[i * (kD + 1) + c])) * static_cast<double>(kmax[c]);
          const double rest = bound * 0.12625 + static_cast<double>(__int_as_float(0xff800000));
          if (!(rest < static_cast<double>(m) - 1000.0)) skip = 0;
        }
        __syncthreads();
        if (skip) continue;  // the same for every thread
      }
      float sv[kBc / kTpr], lm = kNegInf;
      for (int w = 0; w < kBc / kTpr; ++w) {
        const int jj = lane + w * kTpr;
        const long long j = j0 + jj;
        float sc = kNegInf;
        if (rv && j < kSk) {
          float dot = 0.f;
          for (long long c = 0; c < kD; ++c) dot += qs[i * (kD + 1) + c] * ks[jj * (kD + 1) + c];
          sc = 0.125f * dot;
          sc = sc + mask[b * ms0 + r * ms2 + j * ms3];
          lm = gf::max(lm, sc);
        }
        sv[w] = sc;
      }
      pmax[i * kTpr + lane] = lm;
      __syncthreads();
      float mt = pmax[i * kTpr];
      for (int u = 1; u < kTpr; ++u) mt = gf::max(mt, pmax[i * kTpr + u]);
      const float mn = gf::max(m, mt);
      const float mu = mn == kNegInf ? 0.f : mn;  // no finite score yet: exponentials of -inf are 0
      const float alpha = expf(m - mu);
      double ls = 0;
      for (int w = 0; w < kBc / kTpr; ++w) {
        const int jj = lane + w * kTpr;
        float p = 0.f;
        if (rv && j0 + jj < kSk) {
          p = expf(sv[w] - mu);
          ls += p;
        }
        ps[i * (kBc + 1) + jj] = p;
      }
      psum[i * kTpr + lane] = ls;
      __syncthreads();
      double lt = 0;
      for (int u = 0; u < kTpr; ++u) lt += psum[i * kTpr + u];
      l = l * static_cast<double>(alpha) + lt;
      m = mn;
      for (int u = 0; u < kAcc; ++u) {
        const long long c = lane + u * kTpr;
        if (c >= kDv) break;
        float o = acc[u] * alpha;
        for (int jj = 0; jj < kBc; ++jj) o += ps[i * (kBc + 1) + jj] * vs[jj * kDv + c];
        acc[u] = o;
      }
    }
    if (rv) {
      const float inv = static_cast<float>(1.0 / l);
      for (int u = 0; u < kAcc; ++u) {
        const long long c = lane + u * kTpr;
        if (c >= kDv) break;
        oh[r * o_sr + c] = acc[u] * inv;
      }
    }
  }
}
