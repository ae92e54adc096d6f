// linear_logits: the canonical fp32 logits hidden @ weight^T, the fused operator's reference.
// Work items are (row block, column block) pairs; each writes only its own block of `out`, and
// each logit is one canonical dot product, so the bits never depend on the threads or blocks.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "detlogp/errors.hpp"
#include "detlogp/fused.hpp"
#include "kernels/cpu/fused/dot_kernels.hpp"
#include "kernels/cpu/fused/widen.hpp"
#include "kernels/cpu/fused/work_pool.hpp"

namespace detlogp {
namespace {

constexpr int64_t kRowBlock = 32;
constexpr int64_t kColBlock = 128;

void check_matrix(const LogitsView& m, const char* name) {
  if (m.rows < 0 || m.cols < 0 || (m.rows > 0 && m.cols > 0 && m.data == nullptr) ||
      m.row_stride < m.cols) {
    throw ContractError(fmt::format(
        "linear_logits: {} must be a 2-D row-major matrix with data and row_stride >= cols; got "
        "rows={} cols={} row_stride={}",
        name, m.rows, m.cols, m.row_stride));
  }
}

}  // namespace

std::vector<std::string> fused_kernel_names() {
  std::vector<std::string> names{fused::reference_dot_ops().name};
  for (const fused::DotOps& ops : fused::simd_dot_ops()) names.push_back(ops.name);
  return names;
}

void linear_logits(const LogitsView& hidden, const LogitsView& weight, const MutableLogitsView& out,
                   const ExecOptions& exec, std::string_view kernel) {
  check_matrix(hidden, "hidden");
  check_matrix(weight, "weight");
  if (hidden.cols != weight.cols) {
    throw ContractError(fmt::format(
        "linear_logits: hidden has {} columns but weight has {}: both are [*, hidden_size]",
        hidden.cols, weight.cols));
  }
  if (out.dtype != DType::fp32 || out.rows != hidden.rows || out.cols != weight.rows ||
      out.row_stride < out.cols || (out.rows > 0 && out.cols > 0 && out.data == nullptr)) {
    throw ContractError(fmt::format(
        "linear_logits: out must be fp32 [{}, {}] (hidden rows x weight rows) with data; got "
        "[{}, {}] {} (row_stride {})",
        hidden.rows, weight.rows, out.rows, out.cols, to_string(out.dtype), out.row_stride));
  }
  const fused::DotOps& ops = fused::dot_ops_for(kernel);
  const int64_t k = hidden.cols;
  if (hidden.rows == 0 || weight.rows == 0) return;
  std::vector<float> h32(static_cast<size_t>(hidden.rows * k));
  for (int64_t r = 0; r < hidden.rows; ++r) fused::widen_row(hidden, r, h32.data() + r * k);
  const int64_t row_blocks = (hidden.rows + kRowBlock - 1) / kRowBlock;
  const int64_t col_blocks = (weight.rows + kColBlock - 1) / kColBlock;
  const int threads = fused::resolve_threads(exec.threads, row_blocks * col_blocks);
  std::vector<std::vector<float>> scratch(static_cast<size_t>(threads));
  auto* dst = static_cast<float*>(out.data);
  fused::run_items(row_blocks * col_blocks, threads, [&](int64_t item, int worker) {
    const int64_t r0 = (item % row_blocks) * kRowBlock;
    const int64_t c0 = (item / row_blocks) * kColBlock;
    const int64_t m = std::min(kRowBlock, hidden.rows - r0);
    const int64_t n = std::min(kColBlock, weight.rows - c0);
    std::vector<float>& w32 = scratch[static_cast<size_t>(worker)];
    w32.resize(static_cast<size_t>(n * k));
    for (int64_t c = 0; c < n; ++c) fused::widen_row(weight, c0 + c, w32.data() + c * k);
    ops.dot_tile(h32.data() + r0 * k, k, m, w32.data(), k, n, k, dst + r0 * out.row_stride + c0,
                 out.row_stride);
  });
}

}  // namespace detlogp
