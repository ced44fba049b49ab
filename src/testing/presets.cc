#include "testing/presets.h"

#include "graphfuse/status.h"

namespace graphfuse {
namespace {

const ElementwisePreset kPresets[] = {
    {"chain", "u = (x + y) * scale + bias[C]",
     [](int64_t r, int64_t c) {
       return StrCat("graph @chain(%x: f32[", r, ",", c, "], %y: f32[", r, ",", c, "], %bias: f32[", c,
                     "]) {\n  %scale: f32[] = const [0.5]\n  %t = Add(%x, %y)\n  %w = Mul(%t, %scale)\n"
                     "  %u = Add(%w, %bias)\n  return %u\n}\n");
     }},
    {"gelu", "y = gelu(x * s + b[C])",
     [](int64_t r, int64_t c) {
       return StrCat("graph @gelu(%x: f32[", r, ",", c, "], %b: f32[", c,
                     "]) {\n  %s: f32[] = const [1.25]\n  %t = Mul(%x, %s)\n  %w = Add(%t, %b)\n  %y = Gelu(%w)\n"
                     "  return %y\n}\n");
     }},
    {"silu", "y = silu(g) * u",
     [](int64_t r, int64_t c) {
       return StrCat("graph @silu(%g: f32[", r, ",", c, "], %u: f32[", r, ",", c,
                     "]) {\n  %s = Silu(%g)\n  %y = Mul(%s, %u)\n  return %y\n}\n");
     }},
    {"residual", "y = ((((attn + x) * a + b[C]) * mask) * k) + x, 6 ops",
     [](int64_t r, int64_t c) {
       return StrCat("graph @residual(%attn: f32[", r, ",", c, "], %x: f32[", r, ",", c, "], %mask: f32[", r, ",", c,
                     "], %b: f32[", c, "]) {\n  %a: f32[] = const [0.75]\n  %k: f32[] = const [1.11111116]\n"
                     "  %h = Add(%attn, %x)\n  %s = Mul(%h, %a)\n  %t = Add(%s, %b)\n  %m = Mul(%t, %mask)\n"
                     "  %d = Mul(%m, %k)\n  %y = Add(%d, %x)\n  return %y\n}\n");
     }},
};

}  // namespace

std::span<const ElementwisePreset> ElementwisePresets() { return kPresets; }

const ElementwisePreset* FindElementwisePreset(const std::string& name) {
  for (const ElementwisePreset& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

}  // namespace graphfuse
