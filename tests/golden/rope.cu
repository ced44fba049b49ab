
}  // namespace gf

extern "C" __global__ void __launch_bounds__(256) rope_f32_cccb19f6(const float* __restrict__ in0, const float* __restrict__ in1, const float* __restrict__ in2, float* __restrict__ out0, const gf::Sizes<4> z) {
  const long long n = z.v[0];
  const long long kD = z.v[1];
  const long long kHalf = z.v[2];
  const unsigned dim1 = static_cast<unsigned>(z.v[3]);
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = first; i < n; i += step) {
    const long long c = i % kD;
    const float x2 = c < kHalf ? -gf::f32_of(in0[i + kHalf]) : gf::f32_of(in0[i - kHalf]);
    const float a = gf::f32_of(in0[i]) * gf::f32_of(in1[(static_cast<unsigned>(i) % dim1)]);
    const float b = x2 * gf::f32_of(in2[(static_cast<unsigned>(i) % dim1)]);
    gf::store(out0 + i, a + b);
  }
}
