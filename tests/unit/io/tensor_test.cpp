#include "io/tensor.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "io_test_util.hpp"

namespace detlogp::io {
namespace {

using testing::expect_contract_error;
using testing::pattern_tensor;

TEST(TensorDTypes, NamesDescrsAndSizes) {
  for (TensorDType dtype : testing::kAllDTypes) {
    EXPECT_EQ(dtype_from_safetensors_name(dtype_name(dtype)), dtype);
    if (const auto descr = npy_descr(dtype)) {
      EXPECT_EQ(dtype_from_npy_descr(*descr), dtype);
    } else {
      EXPECT_EQ(dtype, TensorDType::BF16);
    }
  }
  EXPECT_EQ(itemsize(TensorDType::I64), 8u);
  EXPECT_EQ(itemsize(TensorDType::BF16), 2u);
  EXPECT_EQ(itemsize(TensorDType::BOOL), 1u);
  EXPECT_FALSE(dtype_from_safetensors_name("F64"));
  EXPECT_FALSE(dtype_from_npy_descr(""));
  EXPECT_FALSE(dtype_from_npy_descr(">f4"));
  EXPECT_EQ(logits_dtype(TensorDType::BF16), DType::bf16);
  EXPECT_FALSE(logits_dtype(TensorDType::I32));
  EXPECT_EQ(tensor_dtype(DType::fp16), TensorDType::F16);
}

TEST(TensorSizes, CheckedArithmetic) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(checked_numel(std::vector<std::int64_t>{}), 1u);
  EXPECT_EQ(checked_numel(std::vector<std::int64_t>{2, 3}), 6u);
  EXPECT_EQ(checked_numel(std::vector<std::int64_t>{kMax, kMax, 0}), 0u);
  EXPECT_FALSE(checked_numel(std::vector<std::int64_t>{-1}));
  EXPECT_FALSE(checked_numel(std::vector<std::int64_t>{kMax, 2}));
  EXPECT_EQ(checked_numel(std::vector<std::int64_t>{kMax}), static_cast<std::uint64_t>(kMax));
  EXPECT_FALSE(checked_nbytes(std::vector<std::int64_t>{kMax}, TensorDType::I32));
  EXPECT_EQ(checked_nbytes(std::vector<std::int64_t>{kMax}, TensorDType::U8),
            static_cast<std::uint64_t>(kMax));
}

TEST(TensorViews, LogitsViewOfTwoDimensionalFloats) {
  Tensor t = pattern_tensor("logits", TensorDType::BF16, {3, 5});
  const LogitsView view = as_logits_view(t, "l.safetensors");
  EXPECT_EQ(view.data, t.data.data());
  EXPECT_EQ(view.dtype, DType::bf16);
  EXPECT_EQ(view.rows, 3);
  EXPECT_EQ(view.cols, 5);
  EXPECT_EQ(view.row_stride, 5);
  const MutableLogitsView grad = as_mutable_logits_view(t, "g.safetensors");
  EXPECT_EQ(grad.data, t.data.data());
  const Tensor ints = pattern_tensor("logits", TensorDType::I32, {3, 5});
  expect_contract_error([&] { as_logits_view(ints, "l.npy"); }, "l.npy",
                        "tensor 'logits' has dtype I32; logits must be F32, F16 or BF16");
  const Tensor flat = pattern_tensor("logits", TensorDType::F32, {15});
  expect_contract_error([&] { as_logits_view(flat, "l.npy"); }, "l.npy",
                        "has shape [15]; logits must be 2-D");
}

TEST(TensorViews, TypedVectors) {
  const Tensor i32 = make_tensor<std::int32_t>("targets", TensorDType::I32, {3},
                                               std::vector<std::int32_t>{-1, 0, 151935});
  EXPECT_EQ(to_int64_vector(i32, "t.npy"), (std::vector<std::int64_t>{-1, 0, 151935}));
  const Tensor i64 = make_tensor<std::int64_t>("targets", TensorDType::I64, {2},
                                               std::vector<std::int64_t>{1LL << 40, -5});
  EXPECT_EQ(to_int64_vector(i64, "t.npy"), (std::vector<std::int64_t>{1LL << 40, -5}));
  expect_contract_error(
      [&] { to_int64_vector(pattern_tensor("t", TensorDType::F32, {2}), "t.npy"); }, "t.npy",
      "has dtype F32; expected I64 or I32");

  const Tensor mask = make_tensor<std::uint8_t>("mask", TensorDType::BOOL, {2, 2},
                                                std::vector<std::uint8_t>{1, 0, 0, 1});
  EXPECT_EQ(to_mask_vector(mask, "m.npy"), (std::vector<std::uint8_t>{1, 0, 0, 1}));
  const Tensor bad_mask =
      make_tensor<std::uint8_t>("mask", TensorDType::U8, {2}, std::vector<std::uint8_t>{1, 7});
  expect_contract_error([&] { to_mask_vector(bad_mask, "m.npy"); }, "m.npy",
                        "tensor 'mask': element 1 is 7; a mask holds only 0 and 1");

  const Tensor grad =
      make_tensor<float>("grad_logp", TensorDType::F32, {2}, std::vector<float>{0.5f, -2.0f});
  EXPECT_EQ(to_float_vector(grad, "g.npy"), (std::vector<float>{0.5f, -2.0f}));
  expect_contract_error([&] { to_float_vector(mask, "g.npy"); }, "g.npy", "expected F32");

  EXPECT_THROW(make_tensor<float>("x", TensorDType::F32, {3}, std::vector<float>{1.0f}),
               ContractError);
  EXPECT_THROW(make_tensor<float>("x", TensorDType::F16, {1}, std::vector<float>{1.0f}),
               ContractError);
}

}  // namespace
}  // namespace detlogp::io
