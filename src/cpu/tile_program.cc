#include "cpu/tile_program.h"

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

#include "cpu/cpu_codegen.h"
#include "graphfuse/dtype.h"

namespace graphfuse::cpu {
namespace {

// ---- storage <-> register conversions (plain loops; the compiler vectorizes them) ----------

#if defined(__FLT16_MAX__)  // the compiler has _Float16 for this target (F16C: one instruction)
inline float F16ToF32(uint16_t h) { return static_cast<float>(std::bit_cast<_Float16>(h)); }
inline uint16_t F32ToF16(float f) { return std::bit_cast<uint16_t>(static_cast<_Float16>(f)); }  // RNE
#else  // e.g. clang 14 on x86 (the fuzz build): the bitwise conversions, same results
inline float F16ToF32(uint16_t h) { return F16BitsToF32(h); }
inline uint16_t F32ToF16(float f) { return F32ToF16Bits(f); }
#endif
inline float BF16ToF32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }
inline uint16_t F32ToBF16(float f) {  // round to nearest even; NaN stays a quiet NaN
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t r = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((x & 0x7FFFFFFFu) > 0x7F800000u ? (x >> 16) | 0x40u : r);
}

// Float -> integer: truncate toward zero, saturate, NaN -> 0 (matches Tensor::SetFromDouble).
template <class I>
inline I SaturateToInt(float v) {
  constexpr float lo = static_cast<float>(std::numeric_limits<I>::min());
  constexpr float hi = static_cast<float>(std::numeric_limits<I>::max());  // rounds up to 2^31 / 2^63
  if (!(v == v)) return 0;
  if (v >= hi) return std::numeric_limits<I>::max();
  if (v <= lo) return std::numeric_limits<I>::min();
  return static_cast<I>(v);
}

template <class Dst>
Dst LoadOne(DType t, const void* base, int64_t i);

template <>
inline float LoadOne<float>(DType t, const void* p, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return BF16ToF32(static_cast<const uint16_t*>(p)[i]);
    case DType::kI32: return static_cast<float>(static_cast<const int32_t*>(p)[i]);
    case DType::kI64: return static_cast<float>(static_cast<const int64_t*>(p)[i]);
    case DType::kBool: return static_cast<const uint8_t*>(p)[i] ? 1.f : 0.f;
  }
  return 0;
}
template <>
inline int64_t LoadOne<int64_t>(DType t, const void* p, int64_t i) {
  switch (t) {
    case DType::kI32: return static_cast<const int32_t*>(p)[i];
    case DType::kI64: return static_cast<const int64_t*>(p)[i];
    case DType::kBool: return static_cast<const uint8_t*>(p)[i] ? 1 : 0;
    default: return SaturateToInt<int64_t>(LoadOne<float>(t, p, i));
  }
}

// dst[0..n) = src[0], src[stride], ... converted. Specialized loops for the common strides.
template <class Dst, class Src, class Conv>
inline void ConvertRun(const Src* src, int64_t stride, Dst* dst, int64_t n, Conv conv) {
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) dst[i] = conv(src[i]);
  } else if (stride == 0) {
    const Dst v = conv(src[0]);
    for (int64_t i = 0; i < n; ++i) dst[i] = v;
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = conv(src[i * stride]);
  }
}

template <class Dst>
void LoadRun(DType t, const void* base, int64_t offset, int64_t stride, Dst* dst, int64_t n) {
  auto run = [&](auto* typed, auto conv) { ConvertRun(typed + offset, stride, dst, n, conv); };
  using D = Dst;
  switch (t) {
    case DType::kF32: return run(static_cast<const float*>(base), [](float v) { return static_cast<D>(v); });
    case DType::kF16:
      return run(static_cast<const uint16_t*>(base), [](uint16_t v) {
        if constexpr (std::is_same_v<D, float>) return F16ToF32(v);
        else return SaturateToInt<int64_t>(F16ToF32(v));
      });
    case DType::kBF16:
      return run(static_cast<const uint16_t*>(base), [](uint16_t v) {
        if constexpr (std::is_same_v<D, float>) return BF16ToF32(v);
        else return SaturateToInt<int64_t>(BF16ToF32(v));
      });
    case DType::kI32: return run(static_cast<const int32_t*>(base), [](int32_t v) { return static_cast<D>(v); });
    case DType::kI64: return run(static_cast<const int64_t*>(base), [](int64_t v) { return static_cast<D>(v); });
    case DType::kBool: return run(static_cast<const uint8_t*>(base), [](uint8_t v) { return static_cast<D>(v != 0); });
  }
}

template <class Src>
void StoreRun(const Src* src, DType t, void* base, int64_t offset, int64_t n) {
  auto run = [&](auto* typed, auto conv) {
    auto* out = typed + offset;
    for (int64_t i = 0; i < n; ++i) out[i] = conv(src[i]);
  };
  constexpr bool kFloatSrc = std::is_same_v<Src, float>;
  switch (t) {
    case DType::kF32: return run(static_cast<float*>(base), [](Src v) { return static_cast<float>(v); });
    case DType::kF16: return run(static_cast<uint16_t*>(base), [](Src v) { return F32ToF16(static_cast<float>(v)); });
    case DType::kBF16: return run(static_cast<uint16_t*>(base), [](Src v) { return F32ToBF16(static_cast<float>(v)); });
    case DType::kI32:
      return run(static_cast<int32_t*>(base), [](Src v) {
        if constexpr (kFloatSrc) return SaturateToInt<int32_t>(v);
        else return static_cast<int32_t>(v);  // integer narrowing wraps, as in C and numpy
      });
    case DType::kI64:
      return run(static_cast<int64_t*>(base), [](Src v) {
        if constexpr (kFloatSrc) return SaturateToInt<int64_t>(v);
        else return v;
      });
    case DType::kBool: return run(static_cast<uint8_t*>(base), [](Src v) { return static_cast<uint8_t>(v != 0); });
  }
}

// Register buffers are 8 bytes per element plus 320 bytes (5 cache lines): buffers a multiple
// of 4 KiB apart make a load from one and a store to another at the same offset look like
// the same address to the CPU's memory disambiguation (4K aliasing), which stalled tiles here.
constexpr size_t kRegisterStride = kTileElements * 8 + 320;

// ---- the iteration space -------------------------------------------------------------------

// Dims after dropping size-1 dims and merging neighbours that every operand walks contiguously.
struct Layout {
  TileDims shape;
  InlineVec<TileDims, kMaxTileInputs> strides;  // per input
};

Layout Collapse(const TileProgram& p) {
  Layout l;
  l.strides.resize(p.inputs.size());
  for (size_t d = 0; d < p.shape.size(); ++d) {
    if (p.shape[d] == 1) continue;
    bool merge = !l.shape.empty();
    if (merge) {
      // Merge when each operand's stride of the previous dim equals its stride here times this dim.
      for (size_t k = 0; k < p.inputs.size() && merge; ++k)
        merge = l.strides[k].back() == p.inputs[k].strides[d] * p.shape[d];
    }
    if (merge) {
      l.shape.back() *= p.shape[d];
      for (size_t k = 0; k < p.inputs.size(); ++k) l.strides[k].back() = p.inputs[k].strides[d];
    } else {
      l.shape.push_back(p.shape[d]);
      for (size_t k = 0; k < p.inputs.size(); ++k) l.strides[k].push_back(p.inputs[k].strides[d]);
    }
  }
  if (l.shape.empty()) {  // a scalar or all-ones shape: one element
    l.shape.push_back(1);
    for (auto& s : l.strides) s.push_back(0);
  }
  return l;
}

// Loads elements [start, start+n) of the iteration space of one input into dst.
template <class Dst>
void LoadTile(const TileInput& in, const TileDims& shape, const TileDims& strides, int64_t start,
              int64_t n, Dst* dst) {
  const size_t rank = shape.size();
  int64_t idx[kMaxTileRank];
  int64_t rem = start, offset = 0;
  for (size_t d = rank; d-- > 0;) {
    idx[d] = rem % shape[d];
    rem /= shape[d];
    offset += idx[d] * strides[d];
  }
  const size_t last = rank - 1;
  while (n > 0) {
    const int64_t run = std::min(n, shape[last] - idx[last]);
    GF_CHECK(run > 0, "tile load past the end of the iteration space");
    LoadRun(in.dtype, in.data, offset, strides[last], dst, run);
    dst += run;
    n -= run;
    offset += run * strides[last];
    idx[last] += run;
    for (size_t d = last; d > 0 && idx[d] == shape[d]; --d) {  // carry
      offset -= idx[d] * strides[d];
      idx[d] = 0;
      ++idx[d - 1];
      offset += strides[d - 1];
    }
  }
}

// A launch that writes at least this much f32 output stores it non-temporally (no read for
// ownership, no eviction of the inputs). A smaller output may still be in cache when the next
// kernel reads it, and non-temporal stores would send it to memory (at 4 MiB they made an
// unfused chain slower).
constexpr int64_t kNonTemporalBytes = int64_t{32} << 20;
bool StoresNonTemporally(int64_t f32_out_bytes) { return f32_out_bytes >= kNonTemporalBytes; }
// Elements computed between two rounds of prefetches of the next tile, spread over the phases
// after the first (which reads the inputs itself), so that the tile does not alternate between
// a read phase and a store phase. One burst per tile, or a spread over every phase, gained
// nothing.
constexpr int64_t kPrefetchPiece = 256;

// Non-temporal stores of n floats (dst 64-byte aligned, n a multiple of the vector width).
void StreamStoreF32(const float* src, float* dst, int64_t n) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = 0; i < n; i += lanes) hn::Stream(hn::Load(d, src + i), d, dst + i);
}
void StreamFence() { hwy::FlushStream(); }

struct Plan {
  const TileProgram* p;
  Layout layout;
  int64_t numel = 0;
  InlineVec<bool, kMaxTileInputs> direct_input;                 // read in place (f32, contiguous)
  InlineVec<bool, kMaxTileInputs> scalar_input;                 // one value broadcast everywhere
  InlineVec<bool, kMaxTileInputs> run_direct;                   // f32, stride 1 along the innermost dim
  InlineVec<int, kMaxTileInputs + kMaxTileInstrs> direct_output;  // per register: output written in place, or -1
  InlineVec<F32TileKernel, kMaxTileInstrs> f32;
  InlineVec<F32TileKernel, kMaxTileInstrs> f32_stream;  // the same kernels with non-temporal stores
  InlineVec<I64TileKernel, kMaxTileInstrs> i64;
  InlineVec<bool, kMaxTileInputs + kMaxTileInstrs> read_later;  // per register: an instruction reads it
  bool streaming = false;  // one f32 instruction, every input and the output in place
  // > 0: tiles end at multiples of this (the innermost dim), so that inputs contiguous only
  // along it (a row of a wider matrix, a [C] bias) are read in place rather than gathered.
  int64_t row_tiles = 0;
  // f32 outputs far larger than the caches: stored non-temporally, straight from the
  // instruction that computes them when no later instruction reads them, else from L1.
  bool nt_outputs = false;
  // The program compiled to one loop over vectors (cpu_codegen.h), or null: the tile executor.
  NativeKernel native = nullptr;
  std::shared_ptr<const void> native_code;  // keeps the loop's shared object loaded
  InlineVec<int64_t, kMaxTileInputs> native_row_strides;
  int64_t native_cols = 0;
  InlineVec<OpAttrs, kMaxTileInstrs> native_attrs;
};

// 64-byte aligned: where non-temporal vector stores may write.
bool StreamAligned(const float* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

bool Overlaps(const void* a, size_t na, const void* b, size_t nb) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + nb && pb < pa + na;
}

void RunRange(const Plan& plan, int64_t begin, int64_t end, void* scratch);

// The ragged tail [from, end) of a launch run by whole vectors: on the tile path, stored plainly.
void RunTailOnTiles(const Plan& plan, int64_t from, int64_t end, void* scratch) {
  if (from == end) return;
  Plan tail = plan;
  tail.streaming = false;
  tail.nt_outputs = false;
  RunRange(tail, from, end, scratch);
}

// Runs elements [begin, end) of the iteration space, kTileElements at a time.
void RunRange(const Plan& plan, int64_t begin, int64_t end, void* scratch) {
  const TileProgram& p = *plan.p;
  if (plan.native) {
    // One compiled loop over the whole range (rows' ragged ends included).
    const void* in[kMaxTileInputs];
    void* out[kMaxTileOutputs];
    // Non-temporal stores need every vector aligned: rows of whole vectors from an aligned start.
    bool nt = plan.nt_outputs && begin % VectorLanes() == 0 &&
              (plan.layout.shape.size() == 1 || plan.native_cols % VectorLanes() == 0);
    for (size_t k = 0; k < p.inputs.size(); ++k) in[k] = p.inputs[k].data;
    for (size_t o = 0; o < p.outputs.size(); ++o) {
      out[o] = p.outputs[o].data;
      if (p.outputs[o].dtype == DType::kF32) nt &= StreamAligned(static_cast<float*>(out[o]) + begin);
    }
    plan.native(in, out, plan.native_attrs.data(), plan.native_row_strides.data(), plan.native_cols, begin, end,
                nt ? 1 : 0);
    if (nt) StreamFence();
    return;
  }
  if (plan.streaming) {
    // Nothing to stage: one instruction from memory to memory over whole vectors; a ragged
    // tail (less than one vector) takes the tile path. Each element is computed exactly once:
    // in-place ops must not run twice.
    const int64_t stream_end = begin + (end - begin) / VectorLanes() * VectorLanes();
    const TileInstr& ins = p.instrs[0];
    const float* args[3];
    for (int a = 0; a < 3; ++a) args[a] = static_cast<const float*>(p.inputs[ins.args[a]].data) + begin;
    float* out = static_cast<float*>(p.outputs[0].data) + begin;
    if (stream_end > begin) {
      const bool nt = plan.nt_outputs && StreamAligned(out);
      (nt ? plan.f32_stream[0] : plan.f32[0])(args, out, stream_end - begin, ins.attrs, begin);
      if (nt) StreamFence();
    }
    RunTailOnTiles(plan, stream_end, end, scratch);
    return;
  }
  const int nin = static_cast<int>(p.inputs.size());
  const int lanes = VectorLanes();
  // One 8-byte-per-element buffer per register.
  auto reg_buffer = [&](int r) { return static_cast<char*>(scratch) + static_cast<size_t>(r) * kRegisterStride; };
  void* regs[kMaxTileInputs + kMaxTileInstrs];

  // Scalars (every stride 0) are the same in every tile: fill their registers once, as far as
  // the largest tile of this range reaches (padded to whole vectors).
  const int64_t fill = std::min(kTileElements, (end - begin + lanes - 1) / lanes * lanes);
  for (int k = 0; k < nin; ++k) {
    if (!plan.scalar_input[k]) continue;
    const TileInput& in = p.inputs[k];
    regs[k] = reg_buffer(k);
    if (in.domain == Domain::kF32)
      LoadRun(in.dtype, in.data, 0, 0, static_cast<float*>(regs[k]), fill);
    else
      LoadRun(in.dtype, in.data, 0, 0, static_cast<int64_t*>(regs[k]), fill);
  }

  for (int64_t start = begin, n = 0; start < end; start += n) {
    n = std::min(kTileElements, end - start);
    if (plan.row_tiles > 0) {
      n = std::min(n, plan.row_tiles - start % plan.row_tiles);
      if (n > lanes) n -= n % lanes;  // whole vectors in place; a row's last few elements apart
    }
    const int64_t npad = (n + lanes - 1) / lanes * lanes;
    const bool aligned = (n == npad);  // no vector reads past the tensors' ends

    for (int k = 0; k < nin; ++k) {
      const TileInput& in = p.inputs[k];
      if (plan.scalar_input[k]) continue;
      if (plan.direct_input[k] && aligned) {
        regs[k] = const_cast<float*>(static_cast<const float*>(in.data) + start);
        continue;
      }
      if (plan.run_direct[k] && aligned) {
        // Contiguous along the innermost dim (a [C] bias, a [B,1,S] mask): when the tile stays
        // inside one run, read it in place instead of copying it.
        const TileDims& shape = plan.layout.shape;
        const TileDims& st = plan.layout.strides[k];
        int64_t rem = start, offset = 0, inner = 0;
        for (size_t d = shape.size(); d-- > 0;) {
          const int64_t i = rem % shape[d];
          rem /= shape[d];
          offset += i * st[d];
          if (d + 1 == shape.size()) inner = i;
        }
        if (inner + n <= shape.back()) {
          regs[k] = const_cast<float*>(static_cast<const float*>(in.data) + offset);
          continue;
        }
      }
      regs[k] = reg_buffer(k);
      if (in.domain == Domain::kF32) {
        float* dst = static_cast<float*>(regs[k]);
        LoadTile(in, plan.layout.shape, plan.layout.strides[k], start, n, dst);
        std::fill(dst + n, dst + npad, 0.f);
      } else {
        int64_t* dst = static_cast<int64_t*>(regs[k]);
        LoadTile(in, plan.layout.shape, plan.layout.strides[k], start, n, dst);
        std::fill(dst + n, dst + npad, int64_t{0});
      }
    }
    // Launches stored non-temporally spread the next tile's in-place inputs over the phases
    // after the first (which reads this tile's), a piece at a time between pieces of the
    // kernels, so that DRAM reads overlap the computing and storing phases instead of
    // alternating with them tile by tile.
    const int64_t next = start + n;
    const bool prefetch_next = plan.nt_outputs && aligned && next < end;
    const int ninstr = static_cast<int>(p.instrs.size());
    const int first_phase = ninstr > 1 ? 1 : 0;
    for (int i = 0; i < ninstr; ++i) {
      const TileInstr& ins = p.instrs[i];
      const int r = nin + i;
      const int direct = plan.direct_output[r];
      float* in_place = direct >= 0 && aligned ? static_cast<float*>(p.outputs[direct].data) + start : nullptr;
      // Non-temporal: only a result nothing reads again goes straight to memory.
      const bool nt = plan.nt_outputs && in_place != nullptr && !plan.read_later[r] && StreamAligned(in_place);
      regs[r] = in_place != nullptr && (!plan.nt_outputs || nt) ? static_cast<void*>(in_place)
                                                                 : static_cast<void*>(reg_buffer(r));
      if (ins.domain == Domain::kF32) {
        const float* args[3] = {static_cast<const float*>(regs[ins.args[0]]), static_cast<const float*>(regs[ins.args[1]]),
                                static_cast<const float*>(regs[ins.args[2]])};
        const F32TileKernel kernel = nt ? plan.f32_stream[i] : plan.f32[i];
        if (!prefetch_next || i < first_phase) {
          kernel(args, static_cast<float*>(regs[r]), npad, ins.attrs, start);
        } else {
          // This phase's share of the next tile: [lo, hi), in whole cache lines.
          const int phases = ninstr - first_phase;
          const int64_t lo = kTileElements * (i - first_phase) / phases / 16 * 16;
          const int64_t hi = kTileElements * (i - first_phase + 1) / phases / 16 * 16;
          for (int64_t c = 0; c < npad; c += kPrefetchPiece) {
            const int64_t cn = std::min(kPrefetchPiece, npad - c);
            const int64_t from = lo + (hi - lo) * c / npad / 16 * 16;
            const int64_t to = std::min(lo + (hi - lo) * (c + cn) / npad / 16 * 16, end - next);
            for (int k = 0; k < nin; ++k)
              if (plan.direct_input[k]) PrefetchFloats(static_cast<const float*>(p.inputs[k].data) + next + from, to - from);
            const float* piece[3] = {args[0] + c, args[1] + c, args[2] + c};
            kernel(piece, static_cast<float*>(regs[r]) + c, cn, ins.attrs, start + c);
          }
        }
      } else {
        const int64_t* args[3] = {static_cast<const int64_t*>(regs[ins.args[0]]),
                                  static_cast<const int64_t*>(regs[ins.args[1]]),
                                  static_cast<const int64_t*>(regs[ins.args[2]])};
        plan.i64[i](args, static_cast<int64_t*>(regs[r]), npad, ins.attrs, start);
      }
    }
    for (size_t o = 0; o < p.outputs.size(); ++o) {
      const TileOutput& out = p.outputs[o];
      if (plan.direct_output[out.reg] == static_cast<int>(o) && regs[out.reg] == static_cast<float*>(out.data) + start)
        continue;  // computed in place (non-temporally or not)
      if (plan.nt_outputs && aligned && out.dtype == DType::kF32 && p.RegisterDomain(out.reg) == Domain::kF32 &&
          StreamAligned(static_cast<float*>(out.data) + start)) {
        StreamStoreF32(static_cast<const float*>(regs[out.reg]), static_cast<float*>(out.data) + start, n);
        continue;
      }
      if (p.RegisterDomain(out.reg) == Domain::kF32)
        StoreRun(static_cast<const float*>(regs[out.reg]), out.dtype, out.data, start, n);
      else
        StoreRun(static_cast<const int64_t*>(regs[out.reg]), out.dtype, out.data, start, n);
    }
  }
  if (plan.nt_outputs) StreamFence();
}

}  // namespace

void PrefetchFloats(const float* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) hwy::Prefetch(p + i);  // one per 64-byte line
}

TileDims TileShape(const Shape& s) {
  GF_CHECK(s.size() <= kMaxTileRank, "rank ", s.size());
  TileDims d;
  for (int64_t v : s) d.push_back(v);
  return d;
}

TileDims TileStrides(const Shape& in, const Shape& out) {
  GF_CHECK(out.size() <= kMaxTileRank && in.size() <= out.size(), "rank ", out.size());
  TileDims strides;
  strides.resize(out.size(), 0);
  int64_t stride = 1;
  for (size_t k = 0; k < in.size(); ++k) {
    const size_t di = in.size() - 1 - k, dout = out.size() - 1 - k;
    strides[dout] = (in[di] == 1 && out[dout] != 1) ? 0 : stride;
    stride *= in[di];
  }
  return strides;
}

Domain TileProgram::RegisterDomain(int reg) const {
  const int nin = static_cast<int>(inputs.size());
  return reg < nin ? inputs[reg].domain : instrs[reg - nin].domain;
}

int64_t TileProgram::CostPerElement() const {
  int64_t c = 0;
  for (const TileInstr& i : instrs) c += GetOpInfo(i.op).cost;
  return std::max<int64_t>(c, 1);
}

namespace {

// Why a program stays on the tile executor (the first reason found), or nullptr.
const char* OutsideNativeScope(const Plan& plan, const TileProgram& p) {
  const Layout& l = plan.layout;
  if (l.shape.size() > 2) return "more than two dims after merging";
  for (size_t k = 0; k < p.inputs.size(); ++k) {
    const TileInput& in = p.inputs[k];
    if (!IsFloat(in.dtype) || in.domain != Domain::kF32) return "integer or bool data";
    const int64_t col = l.strides[k].back();
    if (col != 0 && col != 1) return "an input strided along the rows";
    for (const TileOutput& out : p.outputs) {
      // Exactly the output's elements, read before they are written in the same iteration.
      const bool same = in.data == out.data && in.dtype == out.dtype && col == 1 &&
                        (l.shape.size() == 1 || l.strides[k][0] == l.shape.back());
      int64_t span = 1;  // elements the input spans
      for (size_t d = 0; d < l.shape.size(); ++d) span += (l.shape[d] - 1) * l.strides[k][d];
      if (!same && Overlaps(in.data, static_cast<size_t>(span) * DTypeSize(in.dtype), out.data,
                            static_cast<size_t>(plan.numel) * DTypeSize(out.dtype)))
        return "an output overlapping an input";
    }
  }
  for (const TileInstr& ins : p.instrs)
    if (ins.domain != Domain::kF32) return "integer or bool data";
  for (const TileOutput& out : p.outputs)
    if (!IsFloat(out.dtype) || p.RegisterDomain(out.reg) != Domain::kF32) return "integer or bool data";
  return nullptr;
}

// The program as one compiled loop (OutsideNativeScope said it can be): f32 arithmetic over
// f32, f16 or bf16 storage, a space of at most two dims, every input contiguous along the rows
// or broadcast along them.
NativeProgram ToNative(const Plan& plan, const TileProgram& p) {
  const Layout& l = plan.layout;
  NativeProgram np;
  for (size_t k = 0; k < p.inputs.size(); ++k) {
    const int64_t col = l.strides[k].back(), row = l.shape.size() == 2 ? l.strides[k][0] : 0;
    np.inputs.push_back(col == 1 ? NativeRead::kRow : row == 0 ? NativeRead::kScalar : NativeRead::kPerRow);
    np.input_dtypes.push_back(p.inputs[k].dtype);
  }
  for (const TileInstr& ins : p.instrs) np.instrs.push_back(ins);
  for (const TileOutput& out : p.outputs) {
    np.outputs.push_back(out.reg);
    np.output_dtypes.push_back(out.dtype);
  }
  return np;
}

Plan BuildPlan(const TileProgram& p, CpuCodegen* codegen) {
  Plan plan;
  plan.p = &p;
  plan.numel = 1;
  for (int64_t d : p.shape) plan.numel *= d;
  if (plan.numel == 0) return plan;
  plan.layout = Collapse(p);

  const int nin = static_cast<int>(p.inputs.size());
  const int nreg = p.num_registers();
  for (size_t i = 0; i < p.instrs.size(); ++i) {
    const TileInstr& ins = p.instrs[i];
    for (int a = 0; a < GetOpInfo(ins.op).arity; ++a) {
      GF_CHECK(ins.args[a] >= 0 && ins.args[a] < nin + static_cast<int>(i), "bad register");
      GF_CHECK(p.RegisterDomain(ins.args[a]) == ins.domain, "domain mismatch in ", OpName(ins.op));
    }
    plan.f32.push_back(GetF32TileKernel(ins.op));
    plan.f32_stream.push_back(GetF32StreamKernel(ins.op));
    plan.i64.push_back(GetI64TileKernel(ins.op));
    GF_CHECK(ins.domain == Domain::kF32 || plan.i64.back() != nullptr, OpName(ins.op), " has no integer kernel");
  }

  // Inputs read in place: f32 data laid out exactly like the (contiguous) iteration space.
  for (int k = 0; k < nin; ++k) {
    const TileInput& in = p.inputs[k];
    bool contiguous = in.dtype == DType::kF32 && in.domain == Domain::kF32;
    int64_t stride = 1;
    for (size_t d = plan.layout.shape.size(); d-- > 0 && contiguous;) {
      contiguous = plan.layout.strides[k][d] == stride;
      stride *= plan.layout.shape[d];
    }
    plan.direct_input.push_back(contiguous);
    bool scalar = true;
    for (int64_t st : plan.layout.strides[k]) scalar &= st == 0;
    plan.scalar_input.push_back(scalar && !contiguous);
    plan.run_direct.push_back(!contiguous && in.dtype == DType::kF32 && in.domain == Domain::kF32 &&
                              plan.layout.strides[k].back() == 1);
  }
  // Rows of at least kMinRowTile elements that tiles would otherwise straddle (a GEMM
  // epilogue's [M, N] over a [M, S*N] workspace: 75% of 1024-element tiles gathered both
  // projections at N = 1376). Shorter rows keep whole tiles: their per-tile work would
  // shrink with them.
  constexpr int64_t kMinRowTile = 256;
  const int64_t row = plan.layout.shape.empty() ? 0 : plan.layout.shape.back();
  if (plan.layout.shape.size() >= 2 && row >= kMinRowTile && row % kTileElements != 0 &&
      std::any_of(plan.run_direct.begin(), plan.run_direct.end(), [](bool r) { return r; }))
    plan.row_tiles = row;
  // Results written in place: f32 outputs, unless an input read in place overlaps the output
  // and is still read by a later instruction (it would see the new values).
  int last_use[kMaxTileInputs + kMaxTileInstrs];
  std::fill(last_use, last_use + nreg, -1);
  for (size_t i = 0; i < p.instrs.size(); ++i)
    for (int a = 0; a < GetOpInfo(p.instrs[i].op).arity; ++a) last_use[p.instrs[i].args[a]] = static_cast<int>(i);
  plan.read_later.resize(nreg, false);
  for (int r = 0; r < nreg; ++r) plan.read_later[r] = last_use[r] >= 0;
  plan.direct_output.resize(nreg, -1);
  for (size_t o = 0; o < p.outputs.size(); ++o) {
    const TileOutput& out = p.outputs[o];
    if (out.reg < nin || plan.direct_output[out.reg] >= 0) continue;
    if (out.dtype != DType::kF32 || p.RegisterDomain(out.reg) != Domain::kF32) continue;
    const int producer = out.reg - nin;
    bool safe = true;
    for (int k = 0; k < nin; ++k)
      if ((plan.direct_input[k] || plan.run_direct[k]) && last_use[k] > producer &&
          Overlaps(p.inputs[k].data, plan.numel * 4, out.data, plan.numel * 4))
        safe = false;
    if (safe) plan.direct_output[out.reg] = static_cast<int>(o);
  }

  int64_t f32_out_bytes = 0;
  for (const TileOutput& out : p.outputs)
    if (out.dtype == DType::kF32) f32_out_bytes += plan.numel * 4;
  plan.nt_outputs = StoresNonTemporally(f32_out_bytes);
  plan.streaming = p.instrs.size() == 1 && p.outputs.size() == 1 && plan.direct_output[nin] == 0 &&
                   std::all_of(plan.direct_input.begin(), plan.direct_input.end(), [](bool d) { return d; });
  if (codegen) {
    if (const char* why = OutsideNativeScope(plan, p)) {
      CountOutsideScope(*codegen, why);
    } else if (auto kernel = GetNativeKernel(*codegen, ToNative(plan, p)); kernel.ok()) {  // else counted; tiles run it
      plan.native = kernel->kernel;
      plan.native_code = kernel->keep;
      plan.native_cols = plan.layout.shape.back();
      for (int k = 0; k < nin; ++k)
        plan.native_row_strides.push_back(plan.layout.shape.size() == 2 ? plan.layout.strides[k][0] : 0);
      for (const TileInstr& ins : p.instrs) plan.native_attrs.push_back(ins.attrs);
    }
  }
  return plan;
}

}  // namespace

struct TileRunner::Impl {
  TileProgram program;
  Plan plan;
  const CpuCodegen* codegen = nullptr;
};

TileRunner::TileRunner(const TileProgram& p, CpuCodegen* codegen) {
  auto impl = std::make_shared<Impl>();
  impl->program = p;
  impl->plan = BuildPlan(impl->program, codegen);
  impl->codegen = codegen;
  impl_ = std::move(impl);
}

bool TileRunner::native() const { return impl_->plan.native != nullptr; }

int64_t TileRunner::numel() const { return impl_->plan.numel; }

size_t TileRunner::scratch_bytes() const {
  return static_cast<size_t>(impl_->program.num_registers()) * kRegisterStride;
}

void TileRunner::Run(int64_t begin, int64_t end, void* scratch) const {
  GF_CHECK(0 <= begin && begin <= end && end <= impl_->plan.numel, "tile range [", begin, ", ", end, ") outside ",
           impl_->plan.numel);
  if (begin < end) RunRange(impl_->plan, begin, end, scratch);
}

namespace {

// Threads for one launch over numel elements: as the context grants for the work, at most one
// per tile.
int64_t LaunchThreads(const CpuContext& ctx, int64_t numel, int64_t cost_per_element) {
  const int64_t tiles = (numel + kTileElements - 1) / kTileElements;
  return std::min<int64_t>(ctx.ThreadsFor(numel * cost_per_element), tiles);
}

// One launch of a planned program: on the calling thread for small work, else one dispatch.
void RunPlanned(const Plan& plan, const TileProgram& p, const CpuContext& ctx) {
  if (plan.numel == 0) return;
  const int nreg = p.num_registers();
  const int64_t tiles = (plan.numel + kTileElements - 1) / kTileElements;
  const int threads = static_cast<int>(LaunchThreads(ctx, plan.numel, p.CostPerElement()));
  const size_t scratch_bytes = static_cast<size_t>(nreg) * kRegisterStride;
  if (threads <= 1 || ctx.pool == nullptr) {
    // Small launches: the calling thread, no dispatch. Scratch comes from the pool when there is one.
    if (ctx.pool != nullptr) {
      RunRange(plan, 0, plan.numel, ctx.pool->Scratch(0, scratch_bytes));
    } else {
      auto local = std::make_unique_for_overwrite<int64_t[]>((scratch_bytes + 7) / 8);
      RunRange(plan, 0, plan.numel, local.get());
    }
    return;
  }
  ctx.pool->Parallel(threads, [&](int tid, int nt) {
    const int64_t b = tiles * tid / nt, e = tiles * (tid + 1) / nt;
    RunRange(plan, b * kTileElements, std::min(plan.numel, e * kTileElements), ctx.pool->Scratch(tid, scratch_bytes));
  });
}

}  // namespace

bool RunContiguousF32(OpKind kind, std::span<const float* const> in, float* out, int64_t n, const OpAttrs& attrs,
                      const CpuContext& ctx) {
  // The same decisions RunPlanned and BuildPlan would take: one thread, ordinary stores.
  if (n % VectorLanes() != 0 || StoresNonTemporally(n * 4) || in.empty()) return false;
  if (ctx.pool != nullptr && LaunchThreads(ctx, n, GetOpInfo(kind).cost) > 1) return false;
  const float* args[3] = {in[0], in[in.size() > 1 ? 1 : 0], in[in.size() > 2 ? 2 : 0]};
  GetF32PrefetchKernel(kind)(args, out, n, attrs, 0);
  return true;
}

void RunTileProgram(const TileProgram& p, const CpuContext& ctx) { RunPlanned(BuildPlan(p, ctx.codegen), p, ctx); }

void TileRunner::Launch(const CpuContext& ctx) const { RunPlanned(impl_->plan, impl_->program, ctx); }

bool TileRunner::BoundTo(const TileProgram& p, const CpuCodegen* codegen) const {
  if (codegen != impl_->codegen) return false;
  const TileProgram& q = impl_->program;
  if (q.inputs.size() != p.inputs.size() || q.outputs.size() != p.outputs.size()) return false;
  for (size_t k = 0; k < p.inputs.size(); ++k)
    if (q.inputs[k].data != p.inputs[k].data) return false;
  for (size_t k = 0; k < p.outputs.size(); ++k)
    if (q.outputs[k].data != p.outputs[k].data) return false;
  return true;
}

}  // namespace graphfuse::cpu
