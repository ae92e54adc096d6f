// linear_logits: the canonical fp32 logits hidden @ weight^T, the fused operator's reference:
// the arguments checked here, the product computed by the fused kernels of the name given.
#include <fmt/format.h>

#include "detlogp/errors.hpp"
#include "detlogp/fused.hpp"
#include "op/call_checks.hpp"

namespace detlogp {

void linear_logits(const LogitsView& hidden, const LogitsView& weight, const MutableLogitsView& out,
                   const ExecOptions& exec, std::string_view kernel) {
  op::check_matrix(hidden, "hidden", "linear_logits: ");
  op::check_matrix(weight, "weight", "linear_logits: ");
  if (hidden.cols != weight.cols) {
    throw ContractError(
        ErrorCode::wrong_shape, "weight",
        fmt::format(
            "linear_logits: hidden has {} columns but weight has {}: both are [*, hidden_size]",
            hidden.cols, weight.cols));
  }
  if (out.dtype != DType::fp32 || out.rows != hidden.rows || out.cols != weight.rows ||
      out.row_stride < out.cols || (out.rows > 0 && out.cols > 0 && out.data == nullptr)) {
    throw ContractError(
        ErrorCode::wrong_shape, "out",
        fmt::format("linear_logits: out must be fp32 [{}, {}] (hidden rows x weight rows) with "
                    "data; got [{}, {}] {} (row_stride {})",
                    hidden.rows, weight.rows, out.rows, out.cols, to_string(out.dtype),
                    out.row_stride));
  }
  fused_kernels_for(kernel).linear_logits(hidden, weight, out, exec);
}

}  // namespace detlogp
