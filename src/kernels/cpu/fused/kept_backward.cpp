#include "kernels/cpu/fused/kept_backward.hpp"

#include "kernels/cpu/fused/cpu_fused_kernels.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/fused/tree_stack.hpp"
#include "kernels/cpu/fused/widen.hpp"
#include "numerics/canon.hpp"
#include "numerics/linear_canon.hpp"

namespace detlogp::fused {

namespace {

// One kept column of one row: its local weight row and the canon's logit gradient.
struct Entry {
  int64_t row;
  int64_t col;  // local weight row
  float g;
};

// A tree node's grad_hidden sum over [rows, H]; empty stands for all +0 (a node whose tiles
// hold no kept column). Merging follows the canonical tree exactly: left + right elementwise,
// so a +0 side still turns a -0 of the other side into +0.
using Plane = std::vector<float>;

void merge_planes(Plane& left, Plane&& right) {
  if (right.empty()) {
    for (float& v : left) v = v + 0.0f;
    return;
  }
  if (left.empty()) {
    left = std::move(right);
    for (float& v : left) v = 0.0f + v;
    return;
  }
  for (std::size_t i = 0; i < left.size(); ++i) left[i] = left[i] + right[i];
}

}  // namespace

void kept_backward(const FusedShard& shard, std::span<const int64_t> kept, int64_t width,
                   std::span<const TreeNode> nodes, const BackwardInputs& in,
                   const MutableLogitsView& grad_weight, std::span<float> hidden_sums) {
  const int64_t rows = shard.hidden.rows;
  const int64_t hs = shard.hidden.cols;
  const int64_t w = shard.geometry.tile_width;
  const int64_t begin = shard.vocab_start;
  const int64_t end = std::min(begin + shard.weight.rows, shard.geometry.real_vocab);

  // The hidden states and the kept weight rows of this shard, widened once.
  std::vector<float> h32(static_cast<std::size_t>(rows * hs));
  for (int64_t i = 0; i < rows; ++i) widen_row(shard.hidden, i, h32.data() + i * hs);
  std::vector<int64_t> slot(static_cast<std::size_t>(shard.weight.rows), -1);
  std::vector<float> w32;
  auto weight_row = [&](int64_t col) -> const float* {
    int64_t& s = slot[static_cast<std::size_t>(col)];
    if (s < 0) {
      s = static_cast<int64_t>(w32.size() / static_cast<std::size_t>(hs));
      w32.resize(w32.size() + static_cast<std::size_t>(hs));
      widen_row(shard.weight, col, w32.data() + s * hs);
    }
    return w32.data() + s * hs;
  };

  // g(i, c) of every kept column here, rows in increasing order, each row's columns ascending.
  const canon::GradCoefficients base{.has_logp = !in.grad_logp.empty(),
                                     .has_lse = !in.grad_lse.empty(),
                                     .has_entropy = !in.grad_entropy.empty(),
                                     .g_logp = 0.0f,
                                     .g_lse = 0.0f,
                                     .g_entropy = 0.0f};
  std::vector<Entry> entries;
  for (int64_t i = 0; i < rows; ++i) {
    const auto r = static_cast<std::size_t>(i);
    canon::GradCoefficients g = base;
    if (g.has_logp) g.g_logp = in.grad_logp[r];
    if (g.has_lse) g.g_lse = in.grad_lse[r];
    if (g.has_entropy) g.g_entropy = in.grad_entropy[r];
    const float entropy = in.entropy.empty() ? 0.0f : in.entropy[r];
    for (int64_t j = 0; j < width; ++j) {
      const int64_t id = kept[static_cast<std::size_t>(i * width + j)];
      if (id < begin || id >= end) continue;
      const int64_t col = id - begin;
      const float x = canon::canonical_dot(h32.data() + i * hs, weight_row(col), hs);
      const float v = canon::grad_of_logit(x, col == in.target_local[r], in.lse[r], entropy, g,
                                           shard.temperature_of(i), shard.softcap);
      entries.push_back(Entry{i, col, canon::canonicalize(v)});
    }
  }

  if (grad_weight.data != nullptr) {
    // Each kept row's chain over the tokens in increasing order from +0; every other row +0.
    for (int64_t c = 0; c < shard.weight.rows; ++c) fused::zero_row(grad_weight, c, hs);
    std::vector<std::vector<const Entry*>> by_col(static_cast<std::size_t>(shard.weight.rows));
    for (const Entry& e : entries) by_col[static_cast<std::size_t>(e.col)].push_back(&e);
    std::vector<float> acc(static_cast<std::size_t>(hs));
    for (int64_t c = 0; c < shard.weight.rows; ++c) {
      const auto& list = by_col[static_cast<std::size_t>(c)];
      if (list.empty()) continue;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (const Entry* e : list) {
        const float* x = h32.data() + e->row * hs;
        for (int64_t h = 0; h < hs; ++h) acc[h] = canon::chain_step(e->g, x[h], acc[h]);
      }
      fused::narrow_row(acc.data(), hs, grad_weight, c);
    }
  }
  if (hidden_sums.empty()) return;

  // Per tile the chain over its kept columns (increasing column, entries are ordered by row
  // then column), then each cover node's sum by the canonical tree.
  const int64_t real_tiles = shard.geometry.num_real_tiles();
  std::vector<std::vector<const Entry*>> by_tile(static_cast<std::size_t>(real_tiles));
  for (const Entry& e : entries) {
    by_tile[static_cast<std::size_t>((begin + e.col) / w)].push_back(&e);
  }
  const auto plane = static_cast<std::size_t>(rows * hs);
  for (std::size_t j = 0; j < nodes.size(); ++j) {
    TreeStack<Plane, decltype(&merge_planes)> stack(&merge_planes);
    const int64_t t_end = std::min(nodes[j].end_tile(), real_tiles);
    for (int64_t t = nodes[j].first_tile(); t < t_end; ++t) {
      Plane leaf;
      const auto& list = by_tile[static_cast<std::size_t>(t)];
      if (!list.empty()) leaf.assign(plane, 0.0f);
      for (const Entry* e : list) {
        float* acc = leaf.data() + e->row * hs;
        const float* wr = weight_row(e->col);
        for (int64_t h = 0; h < hs; ++h) acc[h] = canon::chain_step(e->g, wr[h], acc[h]);
      }
      stack.push(TreeNode{0, t}, std::move(leaf));
    }
    float* out = hidden_sums.data() + j * plane;
    const Plane sum = stack.empty() ? Plane{} : stack.finish();
    if (sum.empty()) {
      std::fill(out, out + plane, 0.0f);
    } else {
      std::memcpy(out, sum.data(), plane * sizeof(float));
    }
  }
}

void CpuFusedKernels::kept_backward(const FusedShard& shard, std::span<const int64_t> kept,
                                    int64_t width, std::span<const TreeNode> nodes,
                                    const BackwardInputs& in, const MutableLogitsView& grad_weight,
                                    std::span<float> hidden_sums) const {
  fused::kept_backward(shard, kept, width, nodes, in, grad_weight, hidden_sums);
}

}  // namespace detlogp::fused
