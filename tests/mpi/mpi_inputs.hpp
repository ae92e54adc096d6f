#pragma once
// Inputs the MPI operator tests give every rank alike: computed from the row index only, so
// that each process builds the same targets and upstream gradients without sending them.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "op/op_test_util.hpp"

namespace detlogp::testing {

// targets[i] = (i * step + offset) % real: spread over the real vocabulary, every shard hit.
inline std::vector<int64_t> spread_targets(int64_t rows, int64_t real, int64_t step,
                                           int64_t offset) {
  std::vector<int64_t> t(static_cast<std::size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) t[static_cast<std::size_t>(i)] = (i * step + offset) % real;
  return t;
}

// Upstream gradients of logp, LSE and entropy with a short period in the row index, none zero
// on every row, exact in fp32.
inline GradInputs patterned_grads(int64_t rows) {
  GradInputs g;
  for (int64_t i = 0; i < rows; ++i) {
    g.grad_logp.push_back(0.5f + 0.25f * static_cast<float>(i % 3));
    g.grad_lse.push_back(-0.125f * static_cast<float>(i % 5));
    g.grad_entropy.push_back(0.0625f * static_cast<float>(i % 4) - 0.1f);
  }
  return g;
}

}  // namespace detlogp::testing
