#pragma once
// Inputs and comparisons shared by the operator tests that run one call at several TP layouts
// (op_test_util.hpp's run_tp) and compare the runs bit for bit.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
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

// Row `i` of run `a` has the bits of row `j` of run `b` (logp, LSE, entropy, real gradient).
inline void expect_row_same(const TpRun& a, int64_t i, const TpRun& b, int64_t j, int64_t real,
                            const std::string& what) {
  const LogprobResult& x = a.ranks[0].result;
  const LogprobResult& y = b.ranks[0].result;
  EXPECT_EQ(canon::bits_of(x.logp[i]), canon::bits_of(y.logp[j])) << what << " logp row " << i;
  EXPECT_EQ(canon::bits_of(x.lse[i]), canon::bits_of(y.lse[j])) << what << " lse row " << i;
  EXPECT_EQ(canon::bits_of(x.entropy[i]), canon::bits_of(y.entropy[j]))
      << what << " entropy row " << i;
  for (int64_t c = 0; c < real; ++c) {
    ASSERT_EQ(canon::bits_of(a.grad.at(i, c)), canon::bits_of(b.grad.at(j, c)))
        << what << " grad row " << i << " column " << c;
  }
}

// Rows `order` of a matrix, in that order.
inline FullLogits take_rows(const FullLogits& m, const std::vector<int64_t>& order) {
  FullLogits out = m;
  out.rows = static_cast<int64_t>(order.size());
  const auto n = static_cast<std::size_t>(m.cols);
  out.f32.clear();
  out.half.clear();
  for (int64_t r : order) {
    const auto at = static_cast<std::size_t>(r) * n;
    if (m.dtype == DType::fp32) {
      out.f32.insert(out.f32.end(), m.f32.begin() + at, m.f32.begin() + at + n);
    } else {
      out.half.insert(out.half.end(), m.half.begin() + at, m.half.begin() + at + n);
    }
  }
  return out;
}

// Rows `order` of per-row values, `per` values a row, in that order.
template <class T>
std::vector<T> take(const std::vector<T>& v, const std::vector<int64_t>& order, int64_t per = 1) {
  std::vector<T> out;
  for (int64_t r : order) {
    for (int64_t k = 0; k < per; ++k) out.push_back(v[static_cast<std::size_t>(r * per + k)]);
  }
  return out;
}

// Row i keeps sizes[i % sizes.size()] distinct ids (its target among them, when given) in a
// random order, the -1 padding spread between them: [rows, width].
inline std::vector<int64_t> kept_for(const std::vector<int64_t>& targets, int64_t real,
                                     int64_t width, const std::vector<int64_t>& sizes,
                                     uint32_t stream) {
  std::mt19937 gen(stream);
  std::uniform_int_distribution<int64_t> dist(0, real - 1);
  const auto rows = static_cast<int64_t>(targets.size());
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t n = sizes[static_cast<std::size_t>(i) % sizes.size()];
    std::set<int64_t> s;
    if (targets[static_cast<std::size_t>(i)] >= 0) s.insert(targets[static_cast<std::size_t>(i)]);
    while (static_cast<int64_t>(s.size()) < n) s.insert(dist(gen));
    std::vector<int64_t> row(s.begin(), s.end());
    row.resize(static_cast<std::size_t>(width), -1);
    std::shuffle(row.begin(), row.end(), gen);
    ids.insert(ids.end(), row.begin(), row.end());
  }
  return ids;
}

// vLLM's layout: the vocabulary padded to a multiple of 64, ranks of ceil(P / TP) columns, the
// last one the rest.
inline Layout vllm_layout(int64_t real, int64_t tp) {
  const int64_t padded = (real + 63) / 64 * 64;
  const int64_t per = (padded + tp - 1) / tp;
  Layout l{real, padded, {}};
  for (int64_t r = 0; r < tp; ++r) {
    l.bounds.push_back({std::min(r * per, padded), std::min((r + 1) * per, padded)});
  }
  return l;
}

inline Layout from_cuts(int64_t real, int64_t padded, std::vector<int64_t> cuts) {
  Layout l{real, padded, {}};
  int64_t start = 0;
  cuts.push_back(padded);
  for (int64_t end : cuts) {
    l.bounds.push_back({start, end});
    start = end;
  }
  return l;
}

// A random partition of [0, padded) into `tp` ranks: sorted cut points, repeats allowed (ranks
// with no columns), reproducible by `stream`.
inline Layout random_layout(int64_t real, int64_t padded, int64_t tp, uint32_t stream) {
  std::mt19937 gen(stream);
  std::uniform_int_distribution<int64_t> at(0, padded);
  std::vector<int64_t> cuts(static_cast<std::size_t>(tp - 1));
  for (auto& c : cuts) c = at(gen);
  std::sort(cuts.begin(), cuts.end());
  return from_cuts(real, padded, cuts);
}

inline std::string show(const Layout& l) {
  std::string s;
  for (const VocabRange& b : l.bounds)
    s += "[" + std::to_string(b.start) + "," + std::to_string(b.end) + ")";
  return s;
}

// The partitions both operators' split-tile tests run over, for a vocabulary of 1000 real
// columns padded to 1024 and tiles of width w: empty ranks first and in the middle, ranks inside
// one tile, tile 1 over five ranks, the last real tile split, a padding-only and an empty last
// rank, one-column ranks, an aligned one, then 12 random partitions of 2 to 8 ranks.
inline std::vector<Layout> split_tile_layouts(int64_t w) {
  const int64_t real = 1000, padded = 1024;
  std::vector<Layout> layouts = {from_cuts(real, padded, {0, 300, 300, 700}),
                                 from_cuts(real, padded, {130, 140, 150, 250}),
                                 from_cuts(real, padded, {w + 3, w + 5, w + 9, 2 * w - 1}),
                                 from_cuts(real, padded, {500, 995, 1000, 1010}),
                                 from_cuts(real, padded, {999, 1001, 1024}),
                                 from_cuts(real, padded, {1, 2, 1023}),
                                 from_cuts(real, padded, {2 * w, 4 * w})};
  for (uint32_t k = 0; k < 12; ++k) {
    layouts.push_back(random_layout(real, padded, 2 + k % 7, 100 + k));
  }
  return layouts;
}

}  // namespace detlogp::testing
