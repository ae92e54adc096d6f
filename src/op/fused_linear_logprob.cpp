// FusedLinearLogprob: the vocab-parallel logprob straight from hidden states and a weight shard.
// Forward computes, per block of rows and per vocabulary tile, the tile's canonical logits (a
// [rows, W] buffer per thread), reduces them to the canon's leaf partials with the shard
// kernels, and merges leaves by the canonical tree; from the node partials on, it is
// VocabParallelLogprob's protocol (preflight, one all-gather, merge_roots). Backward recomputes
// each logits tile, turns it into the canon's fp32 logit gradient and feeds two fma chains:
// grad_weight over the tokens in increasing order, grad_hidden over the tile's columns, whose
// per-tile sums are merged by the same canonical tree (node partials all-gathered across ranks).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "detlogp/fused.hpp"
#include "detlogp/version.hpp"
#include "kernels/cpu/fused/dot_kernels.hpp"
#include "kernels/cpu/fused/widen.hpp"
#include "kernels/cpu/fused/work_pool.hpp"
#include "numerics/canon.hpp"
#include "op/preflight.hpp"
#include "op/tree_stack.hpp"

namespace detlogp {

struct FusedSavedForward {
  LogitsView hidden;
  LogitsView weight;
  const fused::DotOps* ops = nullptr;
  const ShardKernels* shard_kernels = nullptr;
  std::string backend_id;
  TileGeometry geometry;
  int64_t local_start = 0;
  int64_t tp = 1;
  int64_t tp_rank = 0;
  float temperature = 1.0f;
  std::vector<std::vector<TreeNode>> covers;  // every rank's cover, rank order
  std::vector<int64_t> target_local;          // owned active target's local row, else -1
  std::vector<uint8_t> active;
  bool has_entropy = false;
  ExecOptions exec;
  int64_t row_block = 32;
  std::vector<float> lse;
  std::vector<float> entropy;
};

namespace {

std::string dtype_name(DType d) { return std::string(to_string(d)); }

int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

void check_view(const LogitsView& m, const char* name) {
  if (m.rows < 0 || m.cols < 0 || (m.rows > 0 && m.cols > 0 && m.data == nullptr) ||
      m.row_stride < m.cols) {
    throw ContractError(fmt::format(
        "{} must be a 2-D row-major matrix with data and row_stride >= cols; got rows={} cols={} "
        "row_stride={}",
        name, m.rows, m.cols, m.row_stride));
  }
}

void check_invocation(const LogitsView& hidden, const LogitsView& weight,
                      std::span<const int64_t> targets, const LogprobContract& c,
                      const Communicator& comm, bool validate) {
  const ShardingSpec& sh = c.sharding();
  c.check_tile_alignment();
  check_view(hidden, "hidden");
  check_view(weight, "weight_shard");
  if (hidden.cols <= 0) {
    throw ContractError(fmt::format(
        "hidden has {} columns: the hidden size must be positive ([num_tokens, hidden_size])",
        hidden.cols));
  }
  if (weight.cols != hidden.cols) {
    throw ContractError(fmt::format(
        "weight_shard has {} columns but hidden has {}: the lm_head weight is [local_vocab, "
        "hidden_size] with the hidden states' hidden_size",
        weight.cols, hidden.cols));
  }
  if (weight.rows != sh.local_vocab_size()) {
    throw ContractError(fmt::format(
        "weight_shard has {} rows (vocab columns) but the contract declares local shard [{}, {}) "
        "of size {}",
        weight.rows, sh.local_vocab_start(), sh.local_vocab_end(), sh.local_vocab_size()));
  }
  if (hidden.rows != c.mask().num_tokens()) {
    throw ContractError(
        fmt::format("hidden has {} rows but the contract's MaskSpec declares num_tokens={}",
                    hidden.rows, c.mask().num_tokens()));
  }
  if (static_cast<int64_t>(targets.size()) != hidden.rows) {
    throw ContractError(fmt::format(
        "target_ids must be 1-D with one entry per token: got {} targets for {} hidden rows",
        targets.size(), hidden.rows));
  }
  for (const auto& [m, name] : {std::pair{&hidden, "hidden"}, std::pair{&weight, "weight_shard"}}) {
    if (m->dtype != c.dtype()) {
      throw ContractError(fmt::format("{} dtype {} does not match the contract dtype {}", name,
                                      dtype_name(m->dtype), dtype_name(c.dtype())));
    }
  }
  if (comm.size() != sh.tp_world_size()) {
    throw ContractError(fmt::format(
        "the communicator has {} ranks but the contract declares tp_world_size={}; pass the TP "
        "subgroup, not the global group",
        comm.size(), sh.tp_world_size()));
  }
  if (comm.rank() != sh.tp_rank()) {
    throw ContractError(fmt::format("tp_group rank {} does not match the contract tp_rank={}",
                                    comm.rank(), sh.tp_rank()));
  }
  if (validate) {
    const auto& active = c.mask().active_mask();
    for (std::size_t i = 0; i < targets.size(); ++i) {
      if (active[i] && (targets[i] < 0 || targets[i] >= sh.real_vocab_size())) {
        throw ContractError(fmt::format(
            "active target_ids must lie in the real vocabulary [0, {}); got {} at token {}",
            sh.real_vocab_size(), targets[i], i));
      }
    }
  }
}

std::vector<std::vector<TreeNode>> covers_of_all_ranks(const LogprobContract& c,
                                                       const TileGeometry& g) {
  std::vector<std::vector<TreeNode>> covers;
  for (const VocabRange& b : c.sharding().vocab_shard_bounds()) {
    covers.push_back(canonical_cover(g, b.start / g.tile_width, ceil_div(b.end, g.tile_width)));
  }
  return covers;
}

std::size_t max_cover(const std::vector<std::vector<TreeNode>>& covers) {
  std::size_t m = 0;
  for (const auto& c : covers) m = std::max(m, c.size());
  return m;
}

// A unit of work: a dyadic block of tiles inside cover node `cover`.
struct Item {
  std::size_t cover;
  TreeNode node;
};

// The cover nodes, split in halves (largest first) until there are enough items for the
// threads. Children with no real tile are dropped. The split never changes a bit: the tree is
// the same, only who computes which subtree.
std::vector<Item> split_items(const std::vector<TreeNode>& cover, int64_t real_tiles, int threads) {
  std::vector<Item> items;
  for (std::size_t j = 0; j < cover.size(); ++j) items.push_back(Item{j, cover[j]});
  const std::size_t wanted = static_cast<std::size_t>(threads) * 4;
  while (items.size() < wanted) {
    auto big = std::max_element(items.begin(), items.end(), [](const Item& a, const Item& b) {
      return a.node.level < b.node.level;
    });
    if (big == items.end() || big->node.level == 0) break;
    const Item left{big->cover, TreeNode{big->node.level - 1, big->node.index * 2}};
    const Item right{big->cover, TreeNode{big->node.level - 1, big->node.index * 2 + 1}};
    const auto at = items.erase(big);
    if (right.node.first_tile() < real_tiles) {
      items.insert(items.insert(at, right), left);
    } else {
      items.insert(at, left);
    }
  }
  return items;
}

// Per-thread scratch of the tile loop.
struct Scratch {
  std::vector<float> w32;  // [W, H] the tile's weight rows in fp32 (bf16/fp16 inputs)
  std::vector<float> z;    // [row_block, W] the tile's logits
  std::vector<float> g;    // [row_block, W] their gradient
  std::vector<float> gw;   // [W, H] grad_weight chains of one tile (a single row block)
  std::vector<NodePartial> leaf;
};

// The fp32 weight rows of tile `t` (local rows [first, first + count)): the caller's memory for
// fp32, a widened copy otherwise.
const float* weight_tile(const LogitsView& weight, int64_t first, int64_t count, Scratch& s) {
  const int64_t h = weight.cols;
  if (weight.dtype == DType::fp32) {
    return static_cast<const float*>(weight.data) + first * weight.row_stride;
  }
  s.w32.resize(static_cast<size_t>(count * h));
  for (int64_t c = 0; c < count; ++c) fused::widen_row(weight, first + c, s.w32.data() + c * h);
  return s.w32.data();
}

// The hidden states in fp32: the caller's memory for fp32, a widened copy otherwise.
struct Hidden32 {
  std::vector<float> copy;
  const float* data = nullptr;
  int64_t stride = 0;
};

Hidden32 widen_hidden(const LogitsView& hidden) {
  Hidden32 h;
  if (hidden.dtype == DType::fp32) {
    h.data = static_cast<const float*>(hidden.data);
    h.stride = hidden.row_stride;
    return h;
  }
  h.copy.resize(static_cast<size_t>(hidden.rows * hidden.cols));
  for (int64_t r = 0; r < hidden.rows; ++r)
    fused::widen_row(hidden, r, h.copy.data() + r * hidden.cols);
  h.data = h.copy.data();
  h.stride = hidden.cols;
  return h;
}

// The tiles of a node that hold real columns: [first, end).
std::pair<int64_t, int64_t> real_tiles_of(const TreeNode& node, int64_t real_tiles) {
  return {node.first_tile(), std::min(node.end_tile(), real_tiles)};
}

// The logits of tile t for rows [r0, r0 + m) into s.z ([m, W], row stride W); returns the
// tile's real column count.
int64_t tile_logits(const FusedSavedForward& f, const Hidden32& h, int64_t t, int64_t r0, int64_t m,
                    Scratch& s, const float** w_out) {
  const int64_t w = f.geometry.tile_width;
  const int64_t c0 = t * w;
  const int64_t count = std::min(w, f.geometry.real_vocab - c0);
  const int64_t local = c0 - f.local_start;
  const float* wt = weight_tile(f.weight, local, count, s);
  const int64_t ldw = f.weight.dtype == DType::fp32 ? f.weight.row_stride : f.weight.cols;
  s.z.resize(static_cast<size_t>(m * w));
  f.ops->dot_tile(h.data + r0 * h.stride, h.stride, m, wt, ldw, count, f.weight.cols, s.z.data(),
                  w);
  if (w_out != nullptr) *w_out = wt;
  return count;
}

canon::Partial to_canon(const NodePartial& p) { return canon::Partial{p.m, p.s, p.u}; }

// Forward of one item: the node partial of `node` for every row, out[row].
void forward_item(const FusedSavedForward& f, const Hidden32& h, const TreeNode& node,
                  NodePartial* out, Scratch& s) {
  const int64_t rows = f.hidden.rows;
  const int64_t w = f.geometry.tile_width;
  const auto [t0, t1] = real_tiles_of(node, f.geometry.num_real_tiles());
  const bool ent = f.has_entropy;
  auto merge = [ent](canon::Partial& left, canon::Partial&& right) {
    left = canon::merge(left, right, ent);
  };
  using Stack = op::TreeStack<canon::Partial, decltype(merge)>;
  for (int64_t r0 = 0; r0 < rows; r0 += f.row_block) {
    const int64_t m = std::min(f.row_block, rows - r0);
    std::vector<Stack> stacks(static_cast<size_t>(m), Stack(merge));
    s.leaf.resize(static_cast<size_t>(m));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t count = tile_logits(f, h, t, r0, m, s, nullptr);
      const LogitsView zt{
          .data = s.z.data(), .dtype = DType::fp32, .rows = m, .cols = count, .row_stride = w};
      const ShardSpec spec{
          .vocab_start = t * w, .geometry = f.geometry, .temperature = f.temperature};
      const TreeNode leaf{0, t};
      f.shard_kernels->node_partials(zt, spec, std::span<const TreeNode>(&leaf, 1), ent, s.leaf,
                                     ExecOptions{.threads = 1});
      for (int64_t i = 0; i < m; ++i) stacks[i].push(leaf, to_canon(s.leaf[i]));
    }
    for (int64_t i = 0; i < m; ++i) {
      const canon::Partial p = stacks[i].empty() ? canon::identity_partial() : stacks[i].finish();
      out[r0 + i] = NodePartial{p.m, p.s, p.u};
    }
  }
}

// Adds `right` into `left` elementwise (the canonical tree's merge of two grad_hidden sums).
void add_into(float* left, const float* right, size_t n) {
  for (size_t i = 0; i < n; ++i) left[i] = left[i] + right[i];
}

}  // namespace

FusedLinearLogprob::FusedLinearLogprob(std::string_view kernel, std::string backend_id)
    : kernel_(kernel), backend_id_(std::move(backend_id)) {
  (void)fused::dot_ops_for(kernel_);  // an unknown kernel fails here, not in forward
}

std::string FusedLinearLogprob::kernel_name() const { return fused::dot_ops_for(kernel_).name; }

FusedTraffic FusedLinearLogprob::traffic(const LogprobContract& c, int64_t hidden_size,
                                         bool entropy) {
  FusedTraffic t;
  if (c.sharding().tp_world_size() <= 1) return t;
  const TileGeometry g{.real_vocab = c.sharding().real_vocab_size(), .tile_width = c.tile_width()};
  const auto nodes = static_cast<int64_t>(max_cover(covers_of_all_ranks(c, g)));
  const int64_t rows = c.mask().num_tokens();
  t.preflight_bytes_per_rank = op::preflight_record_bytes();
  t.forward_payload_bytes_per_rank = rows * (nodes * (entropy ? 3 : 2) + 1) * 4;
  t.backward_payload_bytes_per_rank = op::preflight_record_bytes() + nodes * rows * hidden_size * 4;
  return t;
}

FusedLogprobResult FusedLinearLogprob::forward(const LogitsView& hidden, const LogitsView& weight,
                                               std::span<const int64_t> targets,
                                               const LogprobContract& c, Communicator& comm,
                                               const FusedOptions& opt) const {
  const ShardingSpec& sh = c.sharding();
  const int64_t tp = sh.tp_world_size();
  const int64_t rows = hidden.rows;
  const int64_t w = c.tile_width();
  const TileGeometry geometry{.real_vocab = sh.real_vocab_size(), .tile_width = w};
  const std::string backend = fmt::format("{}(hidden={})", backend_id_, hidden.cols);

  std::optional<std::string> local_error;
  try {
    if (opt.row_block <= 0) {
      throw ContractError(fmt::format("row_block = {} must be positive", opt.row_block));
    }
    check_invocation(hidden, weight, targets, c, comm, opt.validate);
  } catch (const ContractError& e) {
    if (comm.size() == 1) throw;
    local_error = e.what();
  }
  if (tp > 1 || comm.size() > 1) {
    op::PreflightFacts facts;
    facts.phase = op::kFusedForwardPhase;
    facts.fingerprint = c.cross_rank_fingerprint();
    facts.backend_id = backend;
    facts.numerics_version = std::string(kNumericsVersion);
    facts.tile_width = w;
    facts.deterministic = true;
    facts.entropy = opt.entropy;
    const VocabRange b = sh.vocab_shard_bounds()[sh.tp_rank()];
    facts.local_begin = b.start / w;
    facts.local_end = ceil_div(b.end, w);
    facts.rows = rows;
    facts.local_error = local_error;
    op::run_preflight(comm, facts);
  }

  auto saved = std::make_shared<FusedSavedForward>();
  FusedSavedForward& f = *saved;
  f.hidden = hidden;
  f.weight = weight;
  f.ops = &fused::dot_ops_for(kernel_);
  f.shard_kernels = f.ops == &fused::reference_dot_ops() ? &reference_kernels() : &simd_kernels();
  f.backend_id = backend;
  f.geometry = geometry;
  f.local_start = sh.local_vocab_start();
  f.tp = tp;
  f.tp_rank = sh.tp_rank();
  f.temperature = c.temperature();
  f.covers = covers_of_all_ranks(c, geometry);
  f.has_entropy = opt.entropy;
  f.exec = opt.exec;
  f.row_block = opt.row_block;
  const auto& active_mask = c.mask().active_mask();
  f.active.resize(static_cast<size_t>(rows));
  f.target_local.assign(static_cast<size_t>(rows), -1);
  std::vector<int64_t> owner(static_cast<size_t>(rows), -1);
  for (int64_t i = 0; i < rows; ++i) {
    f.active[i] = active_mask[i] ? 1 : 0;
    const int64_t t = targets[i];
    if (!active_mask[i] || t < 0 || t >= sh.real_vocab_size()) continue;
    owner[i] = sh.owner_rank(t);
    if (owner[i] == sh.tp_rank()) f.target_local[i] = t - sh.local_vocab_start();
  }

  // This rank's node partials: items (subtrees of cover nodes) on the threads, then each cover
  // node from its items by the tree.
  const Hidden32 h32 = widen_hidden(hidden);
  const std::vector<TreeNode>& cover = f.covers[sh.tp_rank()];
  const int64_t real_tiles = geometry.num_real_tiles();
  const int threads0 = fused::resolve_threads(opt.exec.threads, 1 << 20);
  const std::vector<Item> items = split_items(cover, real_tiles, threads0);
  const int threads = fused::resolve_threads(opt.exec.threads, static_cast<int64_t>(items.size()));
  std::vector<NodePartial> item_out(items.size() * static_cast<size_t>(rows));
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  fused::run_items(static_cast<int64_t>(items.size()), threads, [&](int64_t k, int worker) {
    forward_item(f, h32, items[k].node, item_out.data() + k * rows, scratch[worker]);
  });
  const bool ent = opt.entropy;
  auto merge = [ent](canon::Partial& left, canon::Partial&& right) {
    left = canon::merge(left, right, ent);
  };
  std::vector<NodePartial> local(static_cast<size_t>(rows) * cover.size());
  for (int64_t i = 0; i < rows; ++i) {
    std::size_t k = 0;
    for (std::size_t j = 0; j < cover.size(); ++j) {
      op::TreeStack<canon::Partial, decltype(merge)> stack(merge);
      for (; k < items.size() && items[k].cover == j; ++k) {
        stack.push(items[k].node, to_canon(item_out[k * rows + i]));
      }
      const canon::Partial p = stack.finish();
      local[i * cover.size() + j] = NodePartial{p.m, p.s, p.u};
    }
  }
  // Target logits this rank owns: one canonical dot each, the same bits as linear_logits.
  std::vector<float> target_z(static_cast<size_t>(rows), 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    if (f.target_local[i] < 0) continue;
    Scratch s;
    const float* wr = weight_tile(weight, f.target_local[i], 1, s);
    const int64_t ldw = weight.dtype == DType::fp32 ? weight.row_stride : weight.cols;
    float x = 0.0f;
    f.ops->dot_tile(h32.data + i * h32.stride, h32.stride, 1, wr, ldw, 1, hidden.cols, &x, 1);
    target_z[i] = canon::scale_logit(x, f.temperature);
  }

  // Pack [rows][width](m, s[, u]) + [rows] target logits; one all-gather (as VocabParallelLogprob).
  const std::size_t width = max_cover(f.covers);
  const int64_t pf = ent ? 3 : 2;
  const std::size_t block = static_cast<size_t>(rows) * (width * pf + 1);
  std::vector<float> send(block, 0.0f);
  const canon::Partial id = canon::identity_partial();
  for (int64_t i = 0; i < rows; ++i) {
    float* row = send.data() + i * width * pf;
    for (std::size_t j = 0; j < width; ++j) {
      const NodePartial p =
          j < cover.size() ? local[i * cover.size() + j] : NodePartial{id.m, id.s, id.u};
      row[j * pf] = p.m;
      row[j * pf + 1] = p.s;
      if (pf == 3) row[j * pf + 2] = p.u;
    }
  }
  std::copy(target_z.begin(), target_z.end(), send.begin() + rows * width * pf);
  std::vector<float> recv;
  const float* gathered = send.data();
  if (tp > 1) {
    recv.resize(block * static_cast<size_t>(tp));
    op::collective_step("fused forward all-gather of the node partials", [&] {
      all_gather(comm, std::span<const float>(send), std::span<float>(recv));
    });
    gathered = recv.data();
  }

  FusedLogprobResult out;
  out.lse.resize(static_cast<size_t>(rows));
  if (ent) out.entropy.resize(static_cast<size_t>(rows));
  std::vector<TreeNode> all_nodes;
  for (const auto& cov : f.covers) all_nodes.insert(all_nodes.end(), cov.begin(), cov.end());
  std::vector<NodePartial> all(static_cast<size_t>(rows) * all_nodes.size());
  for (int64_t i = 0; i < rows; ++i) {
    std::size_t k = 0;
    for (int64_t r = 0; r < tp; ++r) {
      for (std::size_t j = 0; j < f.covers[r].size(); ++j) {
        const float* p = gathered + r * block + (i * width + j) * pf;
        all[i * all_nodes.size() + k++] = NodePartial{p[0], p[1], pf == 3 ? p[2] : 0.0f};
      }
    }
  }
  if (rows > 0) {
    f.shard_kernels->merge_roots(geometry, all_nodes, all, rows,
                                 RootsOut{.lse = out.lse, .entropy = out.entropy}, opt.exec);
  }
  out.logp.assign(static_cast<size_t>(rows), 0.0f);
  const float* targets_of = gathered + rows * width * pf;
  for (int64_t i = 0; i < rows; ++i) {
    if (!active_mask[i]) continue;
    if (owner[i] < 0) {
      out.logp[i] = canon::canonical_nan();
      continue;
    }
    out.logp[i] = canon::selected_logp(targets_of[owner[i] * block + i], out.lse[i]);
  }
  if (opt.validate) {
    for (int64_t i = 0; i < rows; ++i) {
      if (active_mask[i] && !std::isfinite(out.lse[i])) {
        throw ContractError(fmt::format(
            "non-finite logsumexp on an active row (token {}: lse={}): logits over the real "
            "vocabulary must be finite for every active token",
            i, out.lse[i]));
      }
    }
  }
  f.lse = out.lse;
  f.entropy = out.entropy;
  out.saved = std::move(saved);
  return out;
}

namespace {

// The canon's fp32 logit gradient of tile rows [0, m) (row stride W) from its logits s.z.
void tile_gradient(const FusedSavedForward& f, int64_t r0, int64_t m, int64_t t, int64_t count,
                   const std::vector<float>& g_logp, const LogprobGrads& g, Scratch& s) {
  const int64_t w = f.geometry.tile_width;
  const int64_t local0 = t * w - f.local_start;
  s.g.resize(static_cast<size_t>(m * w));
  for (int64_t i = 0; i < m; ++i) {
    const int64_t row = r0 + i;
    canon::GradCoefficients gc;
    gc.has_logp = !g_logp.empty();
    gc.has_lse = !g.grad_lse.empty();
    gc.has_entropy = !g.grad_entropy.empty();
    gc.g_logp = gc.has_logp ? g_logp[row] : 0.0f;
    gc.g_lse = gc.has_lse ? g.grad_lse[row] : 0.0f;
    gc.g_entropy = gc.has_entropy ? g.grad_entropy[row] : 0.0f;
    const float lse = f.lse[row];
    const float entropy = gc.has_entropy ? f.entropy[row] : 0.0f;
    const int64_t target = f.target_local[row] - local0;  // column in this tile, or outside
    for (int64_t k = 0; k < count; ++k) {
      const float z = canon::scale_logit(s.z[i * w + k], f.temperature);
      s.g[i * w + k] =
          canon::canonicalize(canon::grad_element(z, k == target, lse, entropy, gc, f.temperature));
    }
  }
}

}  // namespace

void FusedLinearLogprob::backward(const FusedLogprobResult& fwd, const LogprobGrads& g,
                                  const MutableLogitsView& grad_hidden,
                                  const MutableLogitsView& grad_weight, Communicator& comm) const {
  if (!fwd.saved) {
    throw ContractError(
        "backward needs the FusedLogprobResult of a forward call (its saved state is empty)");
  }
  const FusedSavedForward& f = *fwd.saved;
  const int64_t rows = f.hidden.rows;
  const int64_t hs = f.hidden.cols;
  const bool want_hidden = grad_hidden.data != nullptr;
  const bool want_weight = grad_weight.data != nullptr;

  std::optional<std::string> local_error;
  try {
    if (f.backend_id != fmt::format("{}(hidden={})", backend_id_, hs)) {
      throw ContractError(fmt::format(
          "{}: backward was given the result of another operator's forward ({}); call backward "
          "on the operator that ran forward",
          backend_id_, f.backend_id));
    }
    auto check_len = [&](std::span<const float> v, const char* name) {
      if (!v.empty() && static_cast<int64_t>(v.size()) != rows) {
        throw ContractError(fmt::format("{} must have one entry per token: got {} for {} tokens",
                                        name, v.size(), rows));
      }
    };
    check_len(g.grad_logp, "grad_logp");
    check_len(g.grad_lse, "grad_lse");
    check_len(g.grad_entropy, "grad_entropy");
    if (!g.grad_entropy.empty() && !f.has_entropy) {
      throw ContractError(
          "grad_entropy was given but forward ran with entropy=false; run forward with "
          "entropy=true");
    }
    auto check_out = [&](const MutableLogitsView& v, const LogitsView& like, const char* name) {
      if (v.data == nullptr) return;
      if (v.rows != like.rows || v.cols != like.cols || v.row_stride < v.cols ||
          (v.dtype != like.dtype && v.dtype != DType::fp32)) {
        throw ContractError(fmt::format(
            "{} must have the shape [{}, {}] and dtype {} (or fp32); got [{}, {}] {} (row_stride "
            "{})",
            name, like.rows, like.cols, dtype_name(like.dtype), v.rows, v.cols, dtype_name(v.dtype),
            v.row_stride));
      }
    };
    check_out(grad_hidden, f.hidden, "grad_hidden");
    check_out(grad_weight, f.weight, "grad_weight");
    if (comm.size() != f.tp || comm.rank() != f.tp_rank) {
      throw ContractError(fmt::format(
          "backward's communicator (rank {} of {}) is not forward's (rank {} of {}); pass the "
          "same TP group",
          comm.rank(), comm.size(), f.tp_rank, f.tp));
    }
  } catch (const ContractError& e) {
    if (comm.size() == 1) throw;
    local_error = e.what();
  }
  // The grad_hidden exchange is a collective: every rank must agree to run it.
  if (f.tp > 1 || comm.size() > 1) {
    op::PreflightFacts facts;
    facts.phase = op::kFusedBackwardPhase;
    facts.fingerprint = "fused-backward";
    facts.backend_id = f.backend_id;
    facts.numerics_version = std::string(kNumericsVersion);
    facts.tile_width = f.geometry.tile_width;
    facts.entropy = want_hidden;  // decides whether the grad_hidden all-gather runs
    facts.rows = rows;
    facts.local_error = local_error;
    op::run_preflight(comm, facts);
  }
  if (!want_hidden && !want_weight) return;

  std::vector<float> g_logp;
  if (!g.grad_logp.empty()) {
    g_logp.assign(g.grad_logp.begin(), g.grad_logp.end());
    for (int64_t i = 0; i < rows; ++i) {
      if (!f.active[i]) g_logp[i] = 0.0f;
    }
  }

  const Hidden32 h32 = widen_hidden(f.hidden);
  const std::vector<TreeNode>& cover = f.covers[f.tp_rank];
  const int64_t real_tiles = f.geometry.num_real_tiles();
  const int64_t w = f.geometry.tile_width;
  const int threads0 = fused::resolve_threads(f.exec.threads, 1 << 20);
  const std::vector<Item> items = split_items(cover, real_tiles, threads0);
  const int threads = fused::resolve_threads(f.exec.threads, static_cast<int64_t>(items.size()));
  const size_t plane = static_cast<size_t>(rows * hs);  // one [rows, H] grad_hidden sum
  std::vector<float> item_hidden(want_hidden ? items.size() * plane : 0);
  std::vector<Scratch> scratch(static_cast<size_t>(threads));
  const bool weight_direct = want_weight && grad_weight.dtype == DType::fp32;

  fused::run_items(static_cast<int64_t>(items.size()), threads, [&](int64_t k, int worker) {
    Scratch& s = scratch[worker];
    const auto [t0, t1] = real_tiles_of(items[k].node, real_tiles);
    const int64_t local_first = t0 * w - f.local_start;
    const int64_t local_rows = std::min(t1 * w, f.geometry.real_vocab) - t0 * w;
    // grad_weight chains of this item's rows: the output itself (fp32), or an fp32 scratch of
    // one tile when a single row block finishes every chain at once, else of the whole item.
    const bool per_tile = want_weight && !weight_direct && rows <= f.row_block;
    std::vector<float> gw_scratch;
    float* gw = nullptr;
    int64_t ldgw = hs;
    if (want_weight) {
      if (per_tile) {
        s.gw.resize(static_cast<size_t>(w * hs));
      } else if (weight_direct) {
        gw = static_cast<float*>(grad_weight.data) + local_first * grad_weight.row_stride;
        ldgw = grad_weight.row_stride;
      } else {
        gw_scratch.resize(static_cast<size_t>(local_rows * hs));
        gw = gw_scratch.data();
      }
    }
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
    for (int64_t r0 = 0; r0 < rows; r0 += f.row_block) {
      const int64_t m = std::min(f.row_block, rows - r0);
      op::TreeStack<std::vector<float>, decltype(merge)> stack(merge);
      for (int64_t t = t0; t < t1; ++t) {
        const float* wt = nullptr;
        const int64_t count = tile_logits(f, h32, t, r0, m, s, &wt);
        const int64_t ldw = f.weight.dtype == DType::fp32 ? f.weight.row_stride : hs;
        tile_gradient(f, r0, m, t, count, g_logp, g, s);
        if (want_weight) {
          // grad_weight(c, :) chain over tokens r0 .. r0 + m - 1, continuing from earlier blocks.
          float* y = per_tile ? s.gw.data() : gw + (t * w - f.local_start - local_first) * ldgw;
          f.ops->chain(s.g.data(), 1, w, count, m, h32.data + r0 * h32.stride, h32.stride, hs, y,
                       ldgw, r0 == 0);
          for (int64_t c = 0; per_tile && c < count; ++c) {
            fused::narrow_row(y + c * hs, hs, grad_weight, t * w - f.local_start + c);
          }
        }
        if (want_hidden) {
          std::vector<float> part = take(static_cast<size_t>(m * hs));
          f.ops->chain(s.g.data(), w, 1, m, count, wt, ldw, hs, part.data(), hs, true);
          stack.push(TreeNode{0, t}, std::move(part));
        }
      }
      if (want_hidden) {
        std::vector<float> sum = stack.finish();
        std::memcpy(item_hidden.data() + k * plane + r0 * hs, sum.data(),
                    static_cast<size_t>(m * hs) * sizeof(float));
        pool.push_back(std::move(sum));
      }
    }
    if (want_weight && !weight_direct && !per_tile) {
      for (int64_t c = 0; c < local_rows; ++c) {
        fused::narrow_row(gw + c * hs, hs, grad_weight, local_first + c);
      }
    } else if (weight_direct) {
      for (int64_t c = 0; c < local_rows; ++c) {
        float* row = gw + c * ldgw;
        for (int64_t x = 0; x < hs; ++x) row[x] = canon::canonicalize(row[x]);
      }
    }
  });

  if (want_weight) {  // rows at or beyond the real vocabulary: exactly +0
    const int64_t real_local =
        std::clamp<int64_t>(f.geometry.real_vocab - f.local_start, 0, f.weight.rows);
    for (int64_t c = real_local; c < f.weight.rows; ++c) fused::zero_row(grad_weight, c, hs);
  }
  if (!want_hidden) return;

  // Each cover node from its items (in place, in item_hidden), then every rank's nodes.
  auto merge_ptr = [plane](float*& left, float*&& right) { add_into(left, right, plane); };
  using PtrStack = op::TreeStack<float*, decltype(merge_ptr)>;
  const std::size_t width = max_cover(f.covers);
  std::vector<float> send(width * plane, 0.0f);
  {
    std::size_t k = 0;
    for (std::size_t j = 0; j < cover.size(); ++j) {
      PtrStack stack(merge_ptr);
      for (; k < items.size() && items[k].cover == j; ++k) {
        stack.push(items[k].node, item_hidden.data() + k * plane);
      }
      const float* node_sum = stack.finish();
      std::memcpy(send.data() + j * plane, node_sum, plane * sizeof(float));
    }
  }
  std::vector<float>().swap(item_hidden);
  std::vector<float> recv;
  float* gathered = send.data();
  if (f.tp > 1) {
    recv.resize(send.size() * static_cast<size_t>(f.tp));
    op::collective_step("fused backward all-gather of the grad_hidden partials", [&] {
      all_gather(comm, std::span<const float>(send), std::span<float>(recv));
    });
    gathered = recv.data();
  }
  PtrStack root(merge_ptr);
  for (int64_t r = 0; r < f.tp; ++r) {
    for (std::size_t j = 0; j < f.covers[r].size(); ++j) {
      root.push(f.covers[r][j], gathered + (r * width + j) * plane);
    }
  }
  if (root.empty()) {
    for (int64_t i = 0; i < rows; ++i) fused::zero_row(grad_hidden, i, hs);
    return;
  }
  const float* sum = root.finish();
  for (int64_t i = 0; i < rows; ++i) fused::narrow_row(sum + i * hs, hs, grad_hidden, i);
}

}  // namespace detlogp
