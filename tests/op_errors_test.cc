// Bad input gets a clear error naming the op, dtypes and shapes; never a crash.
#include <gtest/gtest.h>

#include "graphfuse/cpu.h"

namespace graphfuse {
namespace {

Tensor T(DType t, Shape s) { return Tensor::Empty(t, s).value(); }

Status RunWith(OpKind op, std::vector<Tensor*> in, Tensor& out, OpAttrs a) {
  std::vector<TensorView> v;
  for (Tensor* t : in) v.push_back(t->view());
  return RunOp(op, v, out.view(), a, CpuContext{});
}

void ExpectError(const Status& s, StatusCode code, std::vector<std::string> needles) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.ToString();
  for (const auto& n : needles) EXPECT_NE(s.message().find(n), std::string::npos) << "missing '" << n << "' in: " << s.message();
}

TEST(OpErrors, IncompatibleBroadcast) {
  Tensor a = T(DType::kF32, {4, 3}), b = T(DType::kF32, {4}), o = T(DType::kF32, {4, 3});
  ExpectError(RunWith(OpKind::kAdd, {&a, &b}, o, {}), StatusCode::kInvalidArgument, {"Add", "[4,3]", "[4]"});
}

TEST(OpErrors, WrongArity) {
  Tensor a = T(DType::kF32, {4}), o = T(DType::kF32, {4});
  ExpectError(RunWith(OpKind::kMul, {&a}, o, {}), StatusCode::kInvalidArgument, {"Mul", "2 input", "got 1"});
  ExpectError(RunWith(OpKind::kRelu, {&a, &a}, o, {}), StatusCode::kInvalidArgument, {"Relu", "1 input", "got 2"});
}

TEST(OpErrors, DTypeMismatch) {
  Tensor a = T(DType::kF32, {4}), b = T(DType::kF16, {4}), o = T(DType::kF32, {4});
  ExpectError(RunWith(OpKind::kSub, {&a, &b}, o, {}), StatusCode::kInvalidArgument, {"Sub", "f32, f16"});
  Tensor i = T(DType::kI32, {4}), oi = T(DType::kI32, {4});
  ExpectError(RunWith(OpKind::kGelu, {&i}, oi, {}), StatusCode::kInvalidArgument, {"Gelu", "i32", "f32, f16 and bf16"});
  Tensor c = T(DType::kF32, {4});
  ExpectError(RunWith(OpKind::kWhere, {&c, &a, &a}, o, {}), StatusCode::kInvalidArgument, {"Where", "condition must be bool"});
  ExpectError(RunWith(OpKind::kAnd, {&a, &a}, o, {}), StatusCode::kInvalidArgument, {"And", "bool"});
}

TEST(OpErrors, WrongOutput) {
  Tensor a = T(DType::kF32, {4, 3}), b = T(DType::kF32, {3});
  Tensor small = T(DType::kF32, {3});
  ExpectError(RunWith(OpKind::kAdd, {&a, &b}, small, {}), StatusCode::kInvalidArgument, {"f32[4,3]", "f32[3]"});
  Tensor boolean = T(DType::kBool, {4, 3}), f = T(DType::kF32, {4, 3});
  ExpectError(RunWith(OpKind::kLess, {&a, &b}, f, {}), StatusCode::kInvalidArgument, {"Less", "bool[4,3]"});
  (void)boolean;
}

TEST(OpErrors, BiasShape) {
  Tensor x = T(DType::kF32, {4, 3}), b = T(DType::kF32, {4}), o = T(DType::kF32, {4, 3});
  ExpectError(RunWith(OpKind::kBias, {&x, &b}, o, {}), StatusCode::kInvalidArgument, {"Bias", "[4,3]", "[4]"});
}

TEST(OpErrors, BadAttributes) {
  Tensor x = T(DType::kF32, {4}), o = T(DType::kF32, {4});
  OpAttrs a = DefaultAttrs(OpKind::kDropout);
  a.alpha = 1.0f;
  ExpectError(RunWith(OpKind::kDropout, {&x}, o, a), StatusCode::kInvalidArgument, {"Dropout", "ratio"});
  OpAttrs c = DefaultAttrs(OpKind::kClip);
  c.alpha = 2, c.beta = 1;
  ExpectError(RunWith(OpKind::kClip, {&x}, o, c), StatusCode::kInvalidArgument, {"Clip", "min <= max"});
}

TEST(OpErrors, PartialAliasing) {
  Tensor x = T(DType::kF32, {8}), o = T(DType::kF32, {4});
  TensorView in = x.view();
  TensorView out{DType::kF32, {8}, x.data_as<float>() + 2};  // overlaps x, shifted
  in.shape = {8};
  Status s = RunOp(OpKind::kNeg, {&in, 1}, out, {}, CpuContext{});
  ExpectError(s, StatusCode::kInvalidArgument, {"Neg", "overlaps input 0"});
  (void)o;
}

TEST(OpErrors, MissingDataAndAbsurdSizes) {
  TensorView in{DType::kF32, {4}, nullptr}, out{DType::kF32, {4}, nullptr};
  ExpectError(RunOp(OpKind::kExp, {&in, 1}, out, {}, CpuContext{}), StatusCode::kInvalidArgument, {"Exp", "no data"});
  TensorView big{DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}, nullptr};
  auto r = RunOp(OpKind::kExp, {&big, 1}, {}, CpuContext{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("int64"), std::string::npos) << r.status().message();
  TensorView huge{DType::kF32, {int64_t{1} << 37}, nullptr};  // 512 GiB
  auto h = RunOp(OpKind::kExp, {&huge, 1}, {}, CpuContext{});
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kResourceExhausted);
}

TEST(OpErrors, UnknownOpName) {
  auto r = OpFromName("Gelu2");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Gelu2"), std::string::npos);
  EXPECT_EQ(*OpFromName("GeluTanh"), OpKind::kGeluTanh);
}

}  // namespace
}  // namespace graphfuse
