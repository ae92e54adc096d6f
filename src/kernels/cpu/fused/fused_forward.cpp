// The CPU fused kernels' forward: per item, per block of rows, per tile, the tile's canonical
// logits (a [rows, W] buffer per thread), reduced to the canon's leaf partials by the shard
// kernels and merged by the canonical tree as the tiles arrive; then the items of each node
// merged into the node's partial. Also the target logits and the plain linear_logits.
#include <algorithm>
#include <functional>
#include <queue>

#include "kernels/common/work_pool.hpp"
#include "kernels/cpu/fused/cpu_fused_kernels.hpp"
#include "kernels/cpu/fused/tree_stack.hpp"
#include "kernels/cpu/fused/widen.hpp"
#include "numerics/canon.hpp"

namespace detlogp::fused {

using kernels::resolve_threads;
using kernels::run_items;

namespace {

int64_t item_tiles(const Item& item, int64_t real_tiles) {
  const auto [t0, t1] = real_tiles_of(item.node, real_tiles);
  return std::max<int64_t>(0, t1 - t0);
}

// The finishing time of the busiest thread when `threads` threads take the items in
// largest_first's order (each the next free thread), against an even share: 1 is perfect balance.
double largest_first_imbalance(const std::vector<Item>& items, int64_t real_tiles, int threads) {
  int64_t total = 0;
  for (const Item& item : items) total += item_tiles(item, real_tiles);
  if (total == 0) return 1.0;
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<>> load;
  for (int t = 0; t < threads; ++t) load.push(0);
  int64_t busiest = 0;
  for (int64_t k : largest_first(items, real_tiles)) {
    const int64_t done = load.top() + item_tiles(items[k], real_tiles);
    load.pop();
    load.push(done);
    busiest = std::max(busiest, done);
  }
  return static_cast<double>(busiest) * threads / static_cast<double>(total);
}

}  // namespace

std::vector<Item> split_items(std::span<const TreeNode> nodes, int64_t real_tiles, int threads) {
  std::vector<Item> items;
  for (std::size_t j = 0; j < nodes.size(); ++j) items.push_back(Item{j, nodes[j]});
  // At least 4 items per thread; up to 6 while the threads would finish more than 3% apart
  // (297 tiles, Qwen3's 151936 / TP 4, on 2 threads: 8 items leave one thread 8% longer, 12
  // items 2%). Each item costs the backward a [rows, H] sum, hence the cap.
  const std::size_t least = static_cast<std::size_t>(threads) * 4;
  const std::size_t most = static_cast<std::size_t>(threads) * 6;
  while (items.size() < most) {
    if (items.size() >= least && largest_first_imbalance(items, real_tiles, threads) <= 1.03) {
      break;
    }
    auto big = std::max_element(items.begin(), items.end(), [](const Item& a, const Item& b) {
      return a.node.level < b.node.level;
    });
    if (big == items.end() || big->node.level == 0) break;
    const Item left{big->node_index, TreeNode{big->node.level - 1, big->node.index * 2}};
    const Item right{big->node_index, TreeNode{big->node.level - 1, big->node.index * 2 + 1}};
    const auto at = items.erase(big);
    if (right.node.first_tile() < real_tiles) {
      items.insert(items.insert(at, right), left);
    } else {
      items.insert(at, left);
    }
  }
  return items;
}

std::vector<int64_t> largest_first(const std::vector<Item>& items, int64_t real_tiles) {
  std::vector<int64_t> order(items.size());
  for (std::size_t k = 0; k < items.size(); ++k) order[k] = static_cast<int64_t>(k);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return item_tiles(items[a], real_tiles) > item_tiles(items[b], real_tiles);
  });
  return order;
}

Hidden32 widen_hidden(const LogitsView& hidden) {
  Hidden32 h;
  if (hidden.dtype == DType::fp32) {
    h.data = static_cast<const float*>(hidden.data);
    h.stride = hidden.row_stride;
    return h;
  }
  h.copy.resize(static_cast<size_t>(hidden.rows * hidden.cols));
  for (int64_t r = 0; r < hidden.rows; ++r) widen_row(hidden, r, h.copy.data() + r * hidden.cols);
  h.data = h.copy.data();
  h.stride = hidden.cols;
  return h;
}

const float* weight_rows(const LogitsView& weight, int64_t first, int64_t count, Scratch& s,
                         int64_t* ld) {
  const int64_t h = weight.cols;
  if (weight.dtype == DType::fp32) {
    *ld = weight.row_stride;
    return static_cast<const float*>(weight.data) + first * weight.row_stride;
  }
  s.w32.resize(static_cast<size_t>(count * h));
  for (int64_t c = 0; c < count; ++c) widen_row(weight, first + c, s.w32.data() + c * h);
  *ld = h;
  return s.w32.data();
}

void pack_row_block(const DotOps& ops, const Hidden32& h, int64_t r0, int64_t m, int64_t k,
                    Scratch& s) {
  ops.pack_rows(h.data + r0 * h.stride, h.stride, m, k, s.rows);
}

int64_t tile_logits(const DotOps& ops, const FusedShard& shard, int64_t t, Scratch& s,
                    const float** w_out, int64_t* ldw_out) {
  const int64_t w = shard.geometry.tile_width;
  const auto [c0, c1] = tile_columns(shard, t);
  const int64_t count = c1 - c0;
  int64_t ldw = 0;
  const float* wt = weight_rows(shard.weight, c0 - shard.vocab_start, count, s, &ldw);
  s.z.resize(static_cast<size_t>(s.rows.m * w));
  ops.dot_packed(s.rows, wt, ldw, count, s.z.data(), w);
  if (w_out != nullptr) *w_out = wt;
  if (ldw_out != nullptr) *ldw_out = ldw;
  return count;
}

namespace {

canon::Partial to_canon(const NodePartial& p) { return canon::Partial{p.m, p.s, p.u}; }

// The partial of `node` for every row: out[row].
void item_partials(const DotOps& ops, const ShardKernels& shard_kernels, const FusedShard& shard,
                   const Hidden32& h, const TreeNode& node, bool ent, NodePartial* out,
                   Scratch& s) {
  const int64_t rows = shard.hidden.rows;
  const int64_t w = shard.geometry.tile_width;
  const auto [t0, t1] = real_tiles_of(node, shard.geometry.num_real_tiles());
  auto merge = [ent](canon::Partial& left, canon::Partial&& right) {
    left = canon::merge(left, right, ent);
  };
  using Stack = TreeStack<canon::Partial, decltype(merge)>;
  for (int64_t r0 = 0; r0 < rows; r0 += shard.row_block) {
    const int64_t m = std::min(shard.row_block, rows - r0);
    std::vector<Stack> stacks(static_cast<size_t>(m), Stack(merge));
    s.leaf.resize(static_cast<size_t>(m));
    pack_row_block(ops, h, r0, m, shard.hidden.cols, s);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t count = tile_logits(ops, shard, t, s);
      const LogitsView zt{
          .data = s.z.data(), .dtype = DType::fp32, .rows = m, .cols = count, .row_stride = w};
      const ShardSpec spec{
          .vocab_start = t * w,
          .geometry = shard.geometry,
          .temperature = shard.temperature,
          .softcap = shard.softcap,
          .row_temperature =
              shard.row_temperature.empty()
                  ? std::span<const float>()
                  : shard.row_temperature.subspan(static_cast<size_t>(r0), static_cast<size_t>(m))};
      const TreeNode leaf{0, t};
      shard_kernels.node_partials(zt, spec, std::span<const TreeNode>(&leaf, 1), ent, s.leaf,
                                  ExecOptions{.threads = 1});
      for (int64_t i = 0; i < m; ++i) stacks[i].push(leaf, to_canon(s.leaf[i]));
    }
    for (int64_t i = 0; i < m; ++i) {
      const canon::Partial p = stacks[i].empty() ? canon::identity_partial() : stacks[i].finish();
      out[r0 + i] = NodePartial{p.m, p.s, p.u};
    }
  }
}

}  // namespace

void CpuFusedKernels::node_partials(const FusedShard& shard, std::span<const TreeNode> nodes,
                                    bool with_entropy, std::span<NodePartial> out,
                                    const ExecOptions& exec) const {
  const int64_t rows = shard.hidden.rows;
  const Hidden32 h32 = widen_hidden(shard.hidden);
  const int threads0 = resolve_threads(exec.threads, 1 << 20);
  const std::vector<Item> items = split_items(nodes, shard.geometry.num_real_tiles(), threads0);
  const int threads = resolve_threads(exec.threads, static_cast<int64_t>(items.size()));
  std::vector<NodePartial> item_out(items.size() * static_cast<size_t>(rows));
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  const std::vector<int64_t> order = largest_first(items, shard.geometry.num_real_tiles());
  run_items(static_cast<int64_t>(items.size()), threads, [&](int64_t next, int worker) {
    const int64_t k = order[next];
    item_partials(ops_, shard_, shard, h32, items[k].node, with_entropy, item_out.data() + k * rows,
                  scratch[worker]);
  });
  // Each node from its items, by the tree.
  auto merge = [with_entropy](canon::Partial& left, canon::Partial&& right) {
    left = canon::merge(left, right, with_entropy);
  };
  for (int64_t i = 0; i < rows; ++i) {
    std::size_t k = 0;
    for (std::size_t j = 0; j < nodes.size(); ++j) {
      TreeStack<canon::Partial, decltype(merge)> stack(merge);
      for (; k < items.size() && items[k].node_index == j; ++k) {
        stack.push(items[k].node, to_canon(item_out[k * rows + i]));
      }
      const canon::Partial p = stack.finish();
      out[i * nodes.size() + j] = NodePartial{p.m, p.s, p.u};
    }
  }
}

void CpuFusedKernels::read_target_logits(const FusedShard& shard,
                                         std::span<const int64_t> target_local,
                                         std::span<float> out) const {
  // One canonical dot each: the same bits as linear_logits.
  const int64_t hs = shard.hidden.cols;
  Scratch s;
  std::vector<float> row(static_cast<size_t>(hs));
  for (std::size_t i = 0; i < target_local.size(); ++i) {
    out[i] = 0.0f;
    if (target_local[i] < 0) continue;
    widen_row(shard.hidden, static_cast<int64_t>(i), row.data());
    int64_t ldw = 0;
    const float* wr = weight_rows(shard.weight, target_local[i], 1, s, &ldw);
    float x = 0.0f;
    ops_.dot_tile(row.data(), hs, 1, wr, ldw, 1, hs, &x, 1);
    out[i] = canon::scored_logit(x, shard.softcap, shard.temperature_of(static_cast<int64_t>(i)));
  }
}

void CpuFusedKernels::linear_logits(const LogitsView& hidden, const LogitsView& weight,
                                    const MutableLogitsView& out, const ExecOptions& exec) const {
  // Work items are (row block, column block) pairs; each writes only its own block of `out`,
  // and each logit is one canonical dot product, so the bits never depend on the blocks.
  // The op's row block: AVX2's lane GEMM packs each weight tile once per call, so more rows
  // per call pay for it (at 32 rows the packing cost eats the gain).
  constexpr int64_t kRowBlock = 96;
  constexpr int64_t kColBlock = 128;
  const int64_t k = hidden.cols;
  if (hidden.rows == 0 || weight.rows == 0) return;
  std::vector<float> h32(static_cast<size_t>(hidden.rows * k));
  for (int64_t r = 0; r < hidden.rows; ++r) widen_row(hidden, r, h32.data() + r * k);
  const int64_t row_blocks = (hidden.rows + kRowBlock - 1) / kRowBlock;
  const int64_t col_blocks = (weight.rows + kColBlock - 1) / kColBlock;
  const int threads = resolve_threads(exec.threads, row_blocks * col_blocks);
  std::vector<std::vector<float>> scratch(static_cast<size_t>(threads));
  auto* dst = static_cast<float*>(out.data);
  run_items(row_blocks * col_blocks, threads, [&](int64_t item, int worker) {
    const int64_t r0 = (item % row_blocks) * kRowBlock;
    const int64_t c0 = (item / row_blocks) * kColBlock;
    const int64_t m = std::min(kRowBlock, hidden.rows - r0);
    const int64_t n = std::min(kColBlock, weight.rows - c0);
    std::vector<float>& w32 = scratch[static_cast<size_t>(worker)];
    w32.resize(static_cast<size_t>(n * k));
    for (int64_t c = 0; c < n; ++c) widen_row(weight, c0 + c, w32.data() + c * k);
    ops_.dot_tile(h32.data() + r0 * k, k, m, w32.data(), k, n, k, dst + r0 * out.row_stride + c0,
                  out.row_stride);
  });
}

}  // namespace detlogp::fused
