#include <gtest/gtest.h>

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string_view>

#include "graphfuse/dtype.h"
#include "graphfuse/shape.h"
#include "graphfuse/status.h"
#include "graphfuse/tensor.h"

namespace graphfuse {
namespace {

TEST(Status, CarriesCodeAndContext) {
  Status s = InvalidArgument("shape ", ShapeToString({2, 3}), " is bad");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "invalid-argument: shape [2,3] is bad");
  EXPECT_EQ(s.WithContext("node n1").message(), "node n1: shape [2,3] is bad");
  Result<int> r = s;
  EXPECT_FALSE(r.ok());
  Result<int> bogus = Status::Ok();  // a Result needs a value or a real error
  EXPECT_EQ(bogus.status().code(), StatusCode::kInternal);
}

// StrCat appends text and integers directly and streams the rest: either way it writes what a
// stream writes.
TEST(Status, StrCatWritesWhatAStreamWrites) {
  auto streamed = [](const auto&... args) {
    std::ostringstream os;
    (os << ... << args);
    return os.str();
  };
  const std::string name = "layer.0";
  const std::string_view view = "view";
  const int64_t lo = INT64_MIN, hi = INT64_MAX;
  const size_t z = SIZE_MAX;
  const char c = 'x';
  const signed char sc = 65;
  const unsigned char uc = 66;
  EXPECT_EQ(StrCat("node '", name, "' at ", -7, ", ", lo, " ", hi, " ", z, c, view, 0u, short{-3}),
            streamed("node '", name, "' at ", -7, ", ", lo, " ", hi, " ", z, c, view, 0u, short{-3}));
  EXPECT_EQ(StrCat(sc, uc, true, false, 0.1f, 1e-7, -2.5), streamed(sc, uc, true, false, 0.1f, 1e-7, -2.5));
  EXPECT_EQ(StrCat(), "");
  EXPECT_EQ(StrCat("a", std::string(), "b"), "ab");
}

TEST(DType, NamesRoundTrip) {
  for (DType t : kAllDTypes) EXPECT_EQ(*ParseDType(DTypeName(t)), t);
  EXPECT_FALSE(ParseDType("f64").ok());
}

// Every f16 value converts to f32 and back unchanged (NaNs stay NaN).
TEST(DType, F16RoundTripsAllValues) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = F16BitsToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16BitsToF32(F32ToF16Bits(f))));
      continue;
    }
    ASSERT_EQ(F32ToF16Bits(f), h) << "f16 bits " << h;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and the next f16 (1 + 2^-10): ties go to even (1).
  EXPECT_EQ(F32ToF16Bits(1.0f + std::ldexp(1.f, -11)), 0x3C00);
  // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even): goes up.
  EXPECT_EQ(F32ToF16Bits(1.0f + 3 * std::ldexp(1.f, -11)), 0x3C02);
  EXPECT_EQ(F32ToF16Bits(65520.f), 0x7C00);  // rounds to inf
  EXPECT_EQ(F32ToF16Bits(65519.f), 0x7BFF);  // max finite
  EXPECT_EQ(F32ToF16Bits(std::ldexp(1.f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(F32ToF16Bits(std::ldexp(1.f, -25)), 0x0000);  // tie to even: 0
  EXPECT_EQ(F32ToF16Bits(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(F32ToF16Bits(-0.f), 0x8000);
  EXPECT_EQ(F32ToF16Bits(-INFINITY), 0xFC00);
}

TEST(DType, BF16RoundsToNearestEven) {
  for (uint32_t b = 0; b < 65536; b += 7) {
    const float f = BF16BitsToF32(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(F32ToBF16Bits(f), b);
    }
  }
  EXPECT_EQ(F32ToBF16Bits(1.0f + std::ldexp(1.f, -8)), 0x3F80);      // tie -> even (1.0)
  EXPECT_EQ(F32ToBF16Bits(1.0f + 3 * std::ldexp(1.f, -8)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(F32ToBF16Bits(FLT_MAX), 0x7F80);                          // rounds to inf
  EXPECT_TRUE(std::isnan(BF16BitsToF32(F32ToBF16Bits(NAN))));
  EXPECT_EQ(F32ToBF16Bits(1e-40f), 0x0001);                           // denormals kept
}

TEST(Shape, Broadcasting) {
  auto b = [](std::vector<Shape> s) { return BroadcastShapes(s); };
  EXPECT_EQ(*b({{2, 3}, {}}), (Shape{2, 3}));
  EXPECT_EQ(*b({{2, 3}, {3}}), (Shape{2, 3}));
  EXPECT_EQ(*b({{2, 3}, {1, 3}}), (Shape{2, 3}));
  EXPECT_EQ(*b({{4, 1, 5}, {3, 1}}), (Shape{4, 3, 5}));
  EXPECT_EQ(*b({{0, 3}, {1, 3}}), (Shape{0, 3}));
  auto bad = b({{2, 3}, {4}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("[2,3] and [4]"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(b({{-1}}).ok());
}

TEST(Shape, Strides) {
  EXPECT_EQ(BroadcastStrides({3}, {2, 3}), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(BroadcastStrides({2, 1}, {2, 3}), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(BroadcastStrides({}, {2, 3}), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(ContiguousStrides({2, 3, 4}), (std::vector<int64_t>{12, 4, 1}));
}

TEST(Tensor, RefusesAbsurdAndMalformedShapes) {
  auto huge = Tensor::Empty(DType::kF32, {int64_t{1} << 40, 1024});
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("f32[1099511627776,1024]"), std::string::npos);
  auto overflow = Tensor::Empty(DType::kF32, {int64_t{1} << 40, int64_t{1} << 40});
  ASSERT_FALSE(overflow.ok());
  EXPECT_FALSE(Tensor::Empty(DType::kF32, {3, -2}).ok());
}

TEST(Tensor, AlignedAndTyped) {
  auto t = Tensor::Empty(DType::kBF16, {3, 5});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data()) % kTensorAlignment, 0u);
  EXPECT_EQ(t->nbytes(), 30u);
  t->SetFromDouble(4, 1.00390625);  // halfway in bf16 -> even
  EXPECT_EQ(t->GetAsDouble(4), 1.0);
  auto e = Tensor::Empty(DType::kF32, {0, 7});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->numel(), 0);
}

}  // namespace
}  // namespace graphfuse
