// The CPU fused kernels' backward: per item, per row block, per tile, the tile's logits again
// (never stored), the canon's fp32 logit gradient g, then two fma chains: grad_weight over the
// tokens in increasing order, grad_hidden over the tile's columns, whose per-tile sums are
// merged by the canonical tree into each node's sum. merge_hidden_sums merges every rank's
// node sums by the same tree.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "kernels/common/work_pool.hpp"
#include "kernels/cpu/fused/cpu_fused_kernels.hpp"
#include "kernels/cpu/fused/tree_stack.hpp"
#include "kernels/cpu/fused/widen.hpp"
#include "numerics/canon.hpp"

namespace detlogp::fused {

using kernels::resolve_threads;
using kernels::run_items;
namespace {

// Adds `right` into `left` elementwise (the canonical tree's merge of two grad_hidden sums).
void add_into(float* left, const float* right, size_t n) {
  for (size_t i = 0; i < n; ++i) left[i] = left[i] + right[i];
}

// The canon's fp32 logit gradient of tile rows [r0, r0 + m) into s.g ([m, W], row stride W)
// from their logits s.z (columns [c0, c0 + count)): the logits operator's backward (the shard
// kernels, vectorised like its forward) on the tile, with the rows' inputs sliced and their
// targets made tile-local.
void tile_gradient(const ShardKernels& shard_kernels, const FusedShard& shard,
                   const BackwardInputs& in, int64_t r0, int64_t m, int64_t c0, int64_t count,
                   Scratch& s) {
  const int64_t w = shard.geometry.tile_width;
  const int64_t local0 = c0 - shard.vocab_start;
  s.g.resize(static_cast<size_t>(m * w));
  s.target.resize(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    const int64_t c = in.target_local[r0 + i] - local0;  // column in this tile, or outside
    s.target[i] = in.target_local[r0 + i] >= 0 && c >= 0 && c < count ? c : -1;
  }
  auto rows = [&](std::span<const float> v) { return v.empty() ? v : v.subspan(r0, m); };
  const BackwardInputs tile_in{.lse = rows(in.lse),
                               .entropy = rows(in.entropy),
                               .target_local = s.target,
                               .grad_logp = rows(in.grad_logp),
                               .grad_lse = rows(in.grad_lse),
                               .grad_entropy = rows(in.grad_entropy)};
  const ShardSpec spec{.vocab_start = c0,
                       .geometry = shard.geometry,
                       .temperature = shard.temperature,
                       .softcap = shard.softcap,
                       .row_temperature = rows(shard.row_temperature)};
  shard_kernels.backward(
      LogitsView{
          .data = s.z.data(), .dtype = DType::fp32, .rows = m, .cols = count, .row_stride = w},
      spec, tile_in,
      MutableLogitsView{
          .data = s.g.data(), .dtype = DType::fp32, .rows = m, .cols = count, .row_stride = w},
      ExecOptions{.threads = 1});
}

}  // namespace

void CpuFusedKernels::backward(const FusedShard& shard, std::span<const TreeNode> nodes,
                               const BackwardInputs& in, const MutableLogitsView& grad_weight,
                               std::span<float> hidden_sums, const ExecOptions& exec) const {
  const int64_t rows = shard.hidden.rows;
  const int64_t hs = shard.hidden.cols;
  const bool want_hidden = !hidden_sums.empty();
  const bool want_weight = grad_weight.data != nullptr;
  const Hidden32 h32 = widen_hidden(shard.hidden);
  const int64_t real_tiles = shard.geometry.num_real_tiles();
  const int64_t w = shard.geometry.tile_width;
  const int threads0 = resolve_threads(exec.threads, 1 << 20);
  const std::vector<Item> items = split_items(nodes, real_tiles, threads0);
  const int threads = resolve_threads(exec.threads, static_cast<int64_t>(items.size()));
  const size_t plane = static_cast<size_t>(rows * hs);  // one [rows, H] grad_hidden sum
  // Every row block of every item writes its rows: no zero fill.
  FloatBuffer item_hidden_buffer;
  float* item_hidden = item_hidden_buffer.get(want_hidden ? items.size() * plane : 0);
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  const bool weight_direct = want_weight && grad_weight.dtype == DType::fp32;
  // A shard may start or end inside a tile only for grad_weight (a chain per column): a tile's
  // grad_hidden sum is one chain over all its columns.
  const int64_t shard_end = shard.vocab_start + shard.weight.rows;
  if (want_hidden && (shard.vocab_start % w != 0 ||
                      (shard_end % w != 0 && shard_end < shard.geometry.real_vocab))) {
    throw std::invalid_argument(
        "fused backward: grad_hidden sums need whole tiles; a shard that starts or ends inside a "
        "tile gives grad_weight only");
  }

  const std::vector<int64_t> order = largest_first(items, real_tiles);
  run_items(static_cast<int64_t>(items.size()), threads, [&](int64_t next, int worker) {
    const int64_t k = order[next];
    Scratch& s = scratch[worker];
    const auto [t0, t1] = real_tiles_of(items[k].node, real_tiles);
    // The item's local weight rows [local_first, + local_rows): its tiles' columns here.
    const int64_t local_first = tile_columns(shard, t0).first - shard.vocab_start;
    const int64_t local_rows =
        t1 > t0 ? tile_columns(shard, t1 - 1).second - shard.vocab_start - local_first : 0;
    // grad_weight chains of this item's rows: the output itself (fp32), or an fp32 scratch of
    // one tile when a single row block finishes every chain at once, else of the whole item.
    const bool per_tile = want_weight && !weight_direct && rows <= shard.row_block;
    float* gw = nullptr;
    int64_t ldgw = hs;
    if (want_weight) {
      if (per_tile) {
        gw = s.gw.get(static_cast<size_t>(w * hs));
      } else if (weight_direct) {
        gw = static_cast<float*>(grad_weight.data) + local_first * grad_weight.row_stride;
        ldgw = grad_weight.row_stride;
      } else {
        gw = s.gw.get(static_cast<size_t>(local_rows * hs));
      }
    }
    // Rows [first, first + count) of the shard's grad_weight, their chains complete in y (row
    // stride ld): canonical NaNs in place (fp32), or rounded once into the output (bf16/fp16).
    auto finish_weight_rows = [&](float* y, int64_t ld, int64_t first, int64_t count) {
      for (int64_t c = 0; c < count; ++c) {
        float* row = y + c * ld;
        if (weight_direct) {
          for (int64_t x = 0; x < hs; ++x) row[x] = canon::canonicalize(row[x]);
        } else {
          narrow_row(row, hs, grad_weight, first + c);
        }
      }
    };
    // grad_hidden: per row block a stack of [m, H] tile sums, merged by the tree.
    std::vector<std::vector<float>> pool;  // free buffers
    auto take = [&](size_t n) {
      std::vector<float> v;
      if (!pool.empty()) {
        v = std::move(pool.back());
        pool.pop_back();
      }
      v.resize(n);
      return v;
    };
    auto merge = [&](std::vector<float>& left, std::vector<float>&& right) {
      add_into(left.data(), right.data(), left.size());
      pool.push_back(std::move(right));
    };
    for (int64_t r0 = 0; r0 < rows; r0 += shard.row_block) {
      const int64_t m = std::min(shard.row_block, rows - r0);
      TreeStack<std::vector<float>, decltype(merge)> stack(merge);
      pack_row_block(ops_, h32, r0, m, hs, s);
      if (want_weight) ops_.pack_values(h32.data + r0 * h32.stride, h32.stride, m, hs, s.values);
      for (int64_t t = t0; t < t1; ++t) {
        const float* wt = nullptr;
        int64_t ldw = 0;
        const int64_t c0 = tile_columns(shard, t).first;
        const int64_t count = tile_logits(ops_, shard, t, s, &wt, &ldw);
        tile_gradient(shard_, shard, in, r0, m, c0, count, s);
        if (want_weight) {
          // grad_weight(c, :) chain over tokens r0 .. r0 + m - 1, continuing from earlier blocks.
          float* y = per_tile ? gw : gw + (c0 - shard.vocab_start - local_first) * ldgw;
          ops_.chain_packed(s.g.data(), 1, w, count, s.values, y, ldgw, r0 == 0);
          // The last row block finishes the tile's chains: its rows are final while still in
          // cache (a pass over the item's rows afterwards would read them back from memory).
          if (r0 + m == rows) finish_weight_rows(y, ldgw, c0 - shard.vocab_start, count);
        }
        if (want_hidden) {
          std::vector<float> part = take(static_cast<size_t>(m * hs));
          ops_.chain(s.g.data(), w, 1, m, count, wt, ldw, hs, part.data(), hs, true);
          stack.push(TreeNode{0, t}, std::move(part));
        }
      }
      if (want_hidden) {
        std::vector<float> sum = stack.finish();
        std::memcpy(item_hidden + k * plane + r0 * hs, sum.data(),
                    static_cast<size_t>(m * hs) * sizeof(float));
        pool.push_back(std::move(sum));
      }
    }
    if (want_weight && rows == 0) {  // no chain ran: every row is the empty sum, +0
      for (int64_t c = 0; c < local_rows; ++c) zero_row(grad_weight, local_first + c, hs);
    }
  });

  if (want_weight) {  // rows at or beyond the real vocabulary: exactly +0
    const int64_t real_local =
        std::clamp<int64_t>(shard.geometry.real_vocab - shard.vocab_start, 0, shard.weight.rows);
    for (int64_t c = real_local; c < shard.weight.rows; ++c) zero_row(grad_weight, c, hs);
  }
  if (!want_hidden) return;

  // Each node's sum from its items, in place in item_hidden.
  auto merge_ptr = [plane](float*& left, float*&& right) { add_into(left, right, plane); };
  std::size_t k = 0;
  for (std::size_t j = 0; j < nodes.size(); ++j) {
    TreeStack<float*, decltype(merge_ptr)> stack(merge_ptr);
    for (; k < items.size() && items[k].node_index == j; ++k) {
      stack.push(items[k].node, item_hidden + k * plane);
    }
    const float* node_sum = stack.finish();
    std::memcpy(hidden_sums.data() + j * plane, node_sum, plane * sizeof(float));
  }
}

void CpuFusedKernels::merge_hidden_sums(std::span<const TreeNode> nodes,
                                        std::span<float* const> sums,
                                        const MutableLogitsView& grad_hidden) const {
  const int64_t rows = grad_hidden.rows;
  const int64_t hs = grad_hidden.cols;
  const size_t plane = static_cast<size_t>(rows * hs);
  if (nodes.empty()) {
    for (int64_t i = 0; i < rows; ++i) zero_row(grad_hidden, i, hs);
    return;
  }
  // Merged in place: each left operand accumulates its right sibling.
  auto merge = [plane](float*& left, float*&& right) { add_into(left, right, plane); };
  TreeStack<float*, decltype(merge)> root(merge);
  for (std::size_t j = 0; j < nodes.size(); ++j) root.push(nodes[j], sums[j]);
  const float* sum = root.finish();
  for (int64_t i = 0; i < rows; ++i) narrow_row(sum + i * hs, hs, grad_hidden, i);
}

}  // namespace detlogp::fused
