
}  // namespace gf

extern "C" __global__ void __launch_bounds__(256) decode_attention_combine_rope_mask_h8_kv2_d64_f32_27fc5df7(const float* __restrict__ part, float* __restrict__ out, const gf::Sizes<5> z) {
  const long long kSplits = z.v[0];
  const long long kItems = z.v[1];
  const long long o_sb = z.v[2];
  const long long o_sh = z.v[3];
  const long long o_sr = z.v[4];
  constexpr long long kH = 8LL, kKv = 2LL, kG = 4LL, kS = 1LL, kDv = 64LL, kR = 4LL;
  for (long long item = blockIdx.x; item < kItems; item += gridDim.x) {
    const long long r = item % kS, bh = item / kS, h = bh % kH, b = bh / kH, kh = h / kG, rr = (h % kG) * kS + r;
    const float* pr = part + ((b * kKv + kh) * kSplits * kR + rr) * (kDv + 2);  // split 0 of the row
    constexpr long long kStep = kR * (kDv + 2);  // from one split's partial of the row to the next
    float* oh = out + b * o_sb + h * o_sh + r * o_sr;
    for (long long c = threadIdx.x; c < kDv; c += 256) {
      float mx = -__int_as_float(0x7f800000);
      for (long long s = 0; s < kSplits; ++s) mx = gf::max(mx, *(pr + s * kStep));
      double l = 0;
      float o = 0.f;
      for (long long s = 0; s < kSplits; ++s) {
        const float w = expf(*(pr + s * kStep) - mx);
        l += static_cast<double>(*(pr + s * kStep + 1)) * w;
        o += *(pr + s * kStep + 2 + c) * w;
      }
      gf::store(&oh[c], o * static_cast<float>(1.0 / l));
    }
  }
}
