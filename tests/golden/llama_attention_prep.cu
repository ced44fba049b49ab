
}  // namespace gf

extern "C" __global__ void __launch_bounds__(256) attention_prep_rope_mask_h4_d16_f32_ea74d85c(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, const float* __restrict__ cs, const float* __restrict__ sn, float* __restrict__ qd, float* __restrict__ kd, float* __restrict__ vd, const gf::Sizes<20> z) {
  const long long kS = z.v[0];
  const long long kSk = z.v[1];
  const long long kQd = z.v[2];
  const long long q_sb = z.v[3];
  const long long q_sh = z.v[4];
  const long long q_sr = z.v[5];
  const long long cq0 = z.v[6];
  const long long cq2 = z.v[7];
  const long long cq3 = z.v[8];
  const long long kKd = z.v[9];
  const long long k_sb = z.v[10];
  const long long k_sh = z.v[11];
  const long long k_sr = z.v[12];
  const long long ck0 = z.v[13];
  const long long ck2 = z.v[14];
  const long long ck3 = z.v[15];
  const long long kVd = z.v[16];
  const long long v_sb = z.v[17];
  const long long v_sh = z.v[18];
  const long long v_sr = z.v[19];
  constexpr long long kH = 4LL, kD = 16LL, kDv = 16LL, kHalf = 8LL;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = first; i < kQd; i += step) {
    const long long c = i % kD, r = i / kD % kS, bh = i / (kD * kS), h = bh % kH, b = bh / kH;
    const float* qh = q + b * q_sb + h * q_sh + r * q_sr;
    const long long co = b * cq0 + r * cq2 + c * cq3;
    const float x2 = c < kHalf ? -qh[c + kHalf] : qh[c - kHalf];
    const float a = qh[c] * cs[co];
    const float s = x2 * sn[co];
    qd[i] = a + s;
  }
  for (long long i = first; i < kKd; i += step) {
    const long long c = i % kD, j = i / kD % kSk, bh = i / (kD * kSk), h = bh % kH, b = bh / kH;
    const float* kh = k + b * k_sb + h * k_sh;
    const long long co = b * ck0 + j * ck2 + c * ck3;
    const float x2 = c < kHalf ? -kh[j * k_sr + (c + kHalf)] : kh[j * k_sr + (c - kHalf)];
    const float a = kh[j * k_sr + (c)] * cs[co];
    const float s = x2 * sn[co];
    kd[i] = a + s;
  }
  for (long long i = first; i < kVd; i += step) {
    const long long c = i % kDv, j = i / kDv % kSk, bh = i / (kDv * kSk), h = bh % kH, b = bh / kH;
    vd[i] = v[b * v_sb + h * v_sh + j * v_sr + c];
  }
}
