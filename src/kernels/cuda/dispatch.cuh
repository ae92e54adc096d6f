#pragma once
// Calls fn(std::integral_constant<DType, d>{}) for the run-time dtype d: a kernel template per
// storage dtype.

#include <stdexcept>
#include <type_traits>

#include "detlogp/dtype.hpp"

namespace detlogp::cuda_impl {

template <class Fn>
void dispatch_dtype(DType d, const Fn& fn) {
  switch (d) {
    case DType::bf16:
      fn(std::integral_constant<DType, DType::bf16>{});
      return;
    case DType::fp16:
      fn(std::integral_constant<DType, DType::fp16>{});
      return;
    case DType::fp32:
      fn(std::integral_constant<DType, DType::fp32>{});
      return;
  }
  throw std::logic_error("detlogp cuda: unknown dtype");
}

}  // namespace detlogp::cuda_impl
