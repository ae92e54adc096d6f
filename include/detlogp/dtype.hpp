#pragma once
// Storage dtype of logits and gradients. String conversion lives with the other contract enums
// (detlogp/enums.hpp).

#include <cstddef>
#include <cstdint>

namespace detlogp {

enum class DType : std::uint8_t { bf16, fp16, fp32 };

constexpr std::size_t dtype_size(DType d) noexcept { return d == DType::fp32 ? 4 : 2; }

}  // namespace detlogp
