#pragma once
// Inputs and comparisons shared by the operator tests that run one call at several TP layouts
// (op_test_util.hpp's run_tp) and compare the runs bit for bit.

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "op_test_util.hpp"

namespace detlogp::testing {

// Targets drawn uniformly from the real vocabulary, reproducible by `stream`.
inline std::vector<int64_t> targets_for(int64_t rows, int64_t real, uint32_t stream) {
  std::mt19937 gen(stream);
  std::uniform_int_distribution<int64_t> dist(0, real - 1);
  std::vector<int64_t> t(static_cast<std::size_t>(rows));
  for (auto& v : t) v = dist(gen);
  return t;
}

// Incoming gradients, one N(0, 1) value per row, reproducible by `stream`.
inline std::vector<float> grads_for(int64_t rows, uint32_t stream) {
  std::mt19937 gen(stream);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> g(static_cast<std::size_t>(rows));
  for (auto& v : g) v = n(gen);
  return g;
}

// Every rank of `b` has the bits of rank 0 of `a` (logp, LSE, entropy), and the real columns
// of the two runs' gradients are the same bytes.
inline void expect_same(const TpRun& a, const TpRun& b, int64_t real, const std::string& what) {
  for (const RankOutputs& r : b.ranks) {
    EXPECT_EQ(bits(a.ranks[0].result.logp), bits(r.result.logp)) << what << ": logp";
    EXPECT_EQ(bits(a.ranks[0].result.lse), bits(r.result.lse)) << what << ": lse";
    EXPECT_EQ(bits(a.ranks[0].result.entropy), bits(r.result.entropy)) << what << ": entropy";
  }
  EXPECT_EQ(real_grad_bytes(a.grad, real), real_grad_bytes(b.grad, real)) << what << ": grad";
}

}  // namespace detlogp::testing
