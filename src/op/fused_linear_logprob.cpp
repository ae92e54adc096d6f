// FusedLinearLogprob: the vocab-parallel logprob straight from hidden states and a weight shard.
// The fused kernels (FusedKernels) produce this rank's node partials and target logits from
// hidden x weight, tile by tile; from there on it is the logits operator's protocol
// (op/call_checks.hpp, op/preflight.hpp, op/forward_exchange.hpp): checks and preflight, one
// all-gather, the roots by the canonical tree, logp. Backward has the kernels produce this
// rank's grad_weight and the grad_hidden sum of each node of its cover; one all-gather moves
// every rank's node sums, and each rank merges them by the same tree. Shard bounds that split
// tiles (op/boundary_fragments.hpp): the rank that completes a split tile gets the logits of the
// later ranks' head fragments in forward, and their weight rows in backward (for the tile's
// grad_hidden chain); each rank computes its own rows' grad_weight.
#include <algorithm>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "detlogp/fused.hpp"
#include "detlogp/version.hpp"
#include "numerics/element_io.hpp"
#include "op/boundary_fragments.hpp"
#include "op/call_checks.hpp"
#include "op/forward_exchange.hpp"
#include "op/full_vocabulary_rows.hpp"
#include "op/kept_selection.hpp"
#include "op/kept_sets.hpp"
#include "op/preflight.hpp"
#include "op/vocab_layout.hpp"

namespace detlogp {

struct FusedSavedForward {
  FusedShard shard;  // views of the hidden states and weight shard, never copies
  const FusedKernels* kernels = nullptr;
  std::string backend_id;
  int64_t tp = 1;
  int64_t tp_rank = 0;
  op::Covers covers;
  std::vector<int64_t> target_local;  // owned active target's local row, else -1
  std::vector<uint8_t> active;
  bool has_entropy = false;
  ExecOptions exec;
  std::vector<float> lse;
  std::vector<float> entropy;
  std::vector<float> row_temperature;  // what shard.row_temperature views (or empty)
  std::vector<int64_t> kept;           // resolved kept ids [rows, kept_width], or empty
  int64_t kept_width = 0;
  std::vector<uint8_t> outside_kept;  // 1 on active rows whose target is outside its set
  // A mixed batch (op/full_vocabulary_rows.hpp): 1 on rows scored over the full vocabulary, and
  // every row's full LSE and entropy (backward's full pass); else empty.
  std::vector<uint8_t> full_rows;
  std::vector<float> full_lse;
  std::vector<float> full_entropy;
  // Shard bounds that split tiles (else fragments is false): the contract (for backward's
  // exchange of weight rows), this rank's columns and how they fall on the tiles, and each row's
  // target column in the split tile this rank completes (or -1).
  bool fragments = false;
  std::optional<LogprobContract> contract;
  VocabRange bounds;
  op::ShardTiles tiles;
  std::vector<int64_t> split_target;

  bool completes_split() const { return fragments && tiles.split_tile >= 0; }
};

namespace {

// The inputs' shapes and dtypes against the contract, then the transport and the targets.
void check_invocation(const FusedKernels& kernels, const LogitsView& hidden,
                      const LogitsView& weight, std::span<const int64_t> targets,
                      const LogprobContract& c, const Communicator& comm, bool validate,
                      std::span<const float> row_temperature) {
  if (!kernels.supports_unaligned_bounds()) {
    if (auto problem = tile_alignment_problem(c)) {
      throw ContractError(ErrorCode::tile_misaligned, "vocab_shard_bounds",
                          *problem + ". The fused kernels " + kernels.name() +
                              " do not; fix: align every bound to a multiple of the tile "
                              "width, run on the CPU fused kernels, or compute the logits and "
                              "call the logits op (VocabParallelLogprob)");
    }
  }
  op::check_matrix(hidden, "hidden");
  op::check_matrix(weight, "weight_shard");
  if (hidden.cols <= 0) {
    throw ContractError(ErrorCode::wrong_shape, "hidden",
                        fmt::format("hidden has {} columns: the hidden size must be positive "
                                    "([num_tokens, hidden_size])",
                                    hidden.cols));
  }
  if (weight.cols != hidden.cols) {
    throw ContractError(
        ErrorCode::wrong_shape, "weight_shard",
        fmt::format("weight_shard has {} columns but hidden has {}: the lm_head weight is "
                    "[local_vocab, hidden_size] with the hidden states' hidden_size",
                    weight.cols, hidden.cols));
  }
  op::check_local_vocab(weight.rows, "weight_shard", "rows (vocab columns)", c);
  op::check_num_tokens(hidden.rows, "hidden", c);
  op::check_one_target_per_row(targets, hidden.rows, "hidden");
  op::check_dtype(hidden.dtype, "hidden", c);
  op::check_dtype(weight.dtype, "weight_shard", c);
  op::check_row_temperature(row_temperature, hidden.rows, c);
  op::check_transport_and_targets(comm, targets, c, validate);
}

// A gradient output: the input's shape, its dtype or fp32 (unless skipped: null data).
void check_gradient_view(const MutableLogitsView& v, const LogitsView& like, const char* name) {
  if (v.data == nullptr) return;
  if (v.rows != like.rows || v.cols != like.cols || v.row_stride < v.cols ||
      (v.dtype != like.dtype && v.dtype != DType::fp32)) {
    throw ContractError(
        ErrorCode::wrong_shape, name,
        fmt::format("{} must have the shape [{}, {}] and dtype {} (or fp32); got [{}, {}] {} "
                    "(row_stride {})",
                    name, like.rows, like.cols, to_string(like.dtype), v.rows, v.cols,
                    to_string(v.dtype), v.row_stride));
  }
}

// The shard's weight rows [first, first + cols) as a shard of their own (global column `start`).
FusedShard sub_shard(const FusedShard& shard, int64_t first, int64_t cols, int64_t start) {
  FusedShard s = shard;
  s.weight.data =
      static_cast<const std::byte*>(shard.weight.data) +
      static_cast<std::size_t>(first * shard.weight.row_stride) * dtype_size(shard.weight.dtype);
  s.weight.rows = cols;
  s.vocab_start = start;
  return s;
}

// Each row's local target column made relative to local column `first` (-1 before it).
std::vector<int64_t> shifted_targets(std::span<const int64_t> target_local, int64_t first) {
  std::vector<int64_t> out(target_local.begin(), target_local.end());
  for (int64_t& t : out) t = t >= first ? t - first : -1;
  return out;
}

// The fp32 logits of this rank's weight rows [first, first + n), [rows, n].
std::vector<float> logits_of_rows(const FusedSavedForward& f, int64_t first, int64_t n,
                                  const ExecOptions& exec) {
  const int64_t rows = f.shard.hidden.rows;
  std::vector<float> z(static_cast<std::size_t>(rows * n));
  if (rows > 0 && n > 0) {
    f.kernels->linear_logits(
        f.shard.hidden, sub_shard(f.shard, first, n, 0).weight,
        MutableLogitsView{
            .data = z.data(), .dtype = DType::fp32, .rows = rows, .cols = n, .row_stride = n},
        exec);
  }
  return z;
}

// The fragment all-gather of forward (call it on every rank when a tile is split): the logits of
// this rank's head fragment and of its own columns of its split tile, then the split tile's fp32
// logits assembled (op::exchange_fragment_logits).
op::SplitTile split_tile_logits(Communicator& comm, const LogprobContract& c,
                                const FusedSavedForward& f, const ExecOptions& exec) {
  const int64_t rows = f.shard.hidden.rows;
  const int64_t head = f.tiles.head_cols(f.bounds);
  const int64_t first = f.tiles.split_tile * f.shard.geometry.tile_width - f.bounds.start;
  const int64_t tail = f.tiles.split_tile >= 0 ? f.bounds.size() - first : 0;
  const std::vector<float> zh = logits_of_rows(f, 0, head, exec);
  const std::vector<float> zt = logits_of_rows(f, std::max<int64_t>(first, 0), tail, exec);
  const auto view = [rows](const std::vector<float>& z, int64_t n) {
    return LogitsView{
        .data = z.data(), .dtype = DType::fp32, .rows = rows, .cols = n, .row_stride = n};
  };
  return op::exchange_fragment_logits(comm, c, view(zh, head), view(zt, tail));
}

// This rank's node partials [rows][cover] (op::covers_of_all_ranks): its full tiles' cover from
// its own weight rows, then its split tile, if any, from its assembled logits (the shard
// kernels' leaf, as for every tile).
std::vector<NodePartial> cover_partials(const FusedSavedForward& f, std::span<const TreeNode> cover,
                                        const op::SplitTile& split, bool entropy,
                                        const ExecOptions& exec) {
  const int64_t rows = f.shard.hidden.rows;
  const std::size_t full = f.completes_split() ? cover.size() - 1 : cover.size();
  std::vector<NodePartial> out(static_cast<std::size_t>(rows) * full);
  if (full > 0) {
    const op::FullTiles t = op::full_tiles_of(f.tiles, f.bounds, f.shard.geometry.tile_width);
    f.kernels->node_partials(sub_shard(f.shard, t.skip, t.cols, t.start), cover.first(full),
                             entropy, out, exec);
  }
  std::vector<NodePartial> tile;
  if (f.completes_split()) {
    tile.resize(static_cast<std::size_t>(rows));
    const ShardSpec spec{.vocab_start = split.vocab_start,
                         .geometry = f.shard.geometry,
                         .temperature = f.shard.temperature,
                         .softcap = f.shard.softcap,
                         .row_temperature = f.shard.row_temperature};
    f.kernels->shard_kernels().node_partials(split.view, spec, cover.last(1), entropy, tile, exec);
  }
  return op::join_split_partials(std::move(out), full, tile, rows);
}

// grad_weight rows [first, first + n) of a gradient view, as a view.
MutableLogitsView grad_rows(const MutableLogitsView& g, int64_t first, int64_t n) {
  MutableLogitsView v = g;
  if (g.data != nullptr) {
    v.data = static_cast<std::byte*>(g.data) +
             static_cast<std::size_t>(first * g.row_stride) * dtype_size(g.dtype);
  }
  v.rows = n;
  return v;
}

// The split tile as a shard of its own: its weight rows assembled from the fragments.
FusedShard split_shard(const FusedSavedForward& f, const op::SplitTile& weights) {
  FusedShard s = f.shard;
  s.weight = weights.view;
  s.vocab_start = weights.vocab_start;
  return s;
}

// This rank's grad_weight and the grad_hidden sum of each node of its cover (sums: [cover][rows,
// H], empty when skipped), over its kept sets (`kept`) or the full vocabulary. Aligned bounds:
// one call over the shard. A split tile: the full tiles' cover from the shard's own rows; with
// grad_hidden, the split tile whole from its weight rows assembled from the fragments
// (`weights`; its grad_weight rows past this shard's end dropped: their holders compute them),
// else its own rows' grad_weight alone; the head fragment's grad_weight alone (a chain per
// row); the padding rows +0.
void cover_backward(const FusedSavedForward& f, bool kept, std::span<const TreeNode> cover,
                    const BackwardInputs& in, const MutableLogitsView& grad_weight,
                    std::span<float> sums, const op::SplitTile& weights) {
  const FusedKernels& k = *f.kernels;
  const bool hidden = !sums.empty();  // (a rank completing a split tile has a cover)
  if (!f.fragments) {
    if (kept) {
      k.kept_backward(f.shard, f.kept, f.kept_width, cover, in, grad_weight, sums);
    } else {
      k.backward(f.shard, cover, in, grad_weight, sums, f.exec);
    }
    return;
  }
  const int64_t rows = f.shard.hidden.rows;
  const auto plane = static_cast<std::size_t>(rows * f.shard.hidden.cols);
  const std::size_t full = f.completes_split() ? cover.size() - 1 : cover.size();
  const std::span<float> full_sums = sums.first(sums.empty() ? 0 : full * plane);
  const std::span<float> tile_sums = sums.subspan(full_sums.size());
  BackwardInputs tile_in = in;
  tile_in.target_local = f.split_target;
  if (kept) {
    // Kept columns: grad_weight a chain per kept column, wherever it lies in the shard.
    k.kept_backward(f.shard, f.kept, f.kept_width, cover.first(full), in, grad_weight, full_sums);
    if (f.completes_split() && hidden) {
      k.kept_backward(split_shard(f, weights), f.kept, f.kept_width, cover.last(1), tile_in,
                      MutableLogitsView{}, tile_sums);
    }
    return;
  }
  const op::ShardTiles& tiles = f.tiles;
  const int64_t w = f.shard.geometry.tile_width;
  if (full > 0) {
    const op::FullTiles t = op::full_tiles_of(tiles, f.bounds, w);
    const std::vector<int64_t> targets = shifted_targets(in.target_local, t.skip);
    BackwardInputs full_in = in;
    full_in.target_local = targets;
    k.backward(sub_shard(f.shard, t.skip, t.cols, t.start), cover.first(full), full_in,
               grad_rows(grad_weight, t.skip, t.cols), full_sums, f.exec);
  }
  const int64_t head = tiles.head_cols(f.bounds);
  if (head > 0 && grad_weight.data != nullptr) {
    const TreeNode leaf{.level = 0, .index = tiles.head_tile};
    k.backward(sub_shard(f.shard, 0, head, f.bounds.start), std::span<const TreeNode>(&leaf, 1), in,
               grad_rows(grad_weight, 0, head), {}, f.exec);
  }
  const int64_t first = tiles.split_tile * w - f.bounds.start;  // the split tile's first row
  if (f.completes_split() && !hidden && grad_weight.data != nullptr) {
    // grad_weight alone: this rank's rows of the tile (a chain per row).
    const std::vector<int64_t> targets = shifted_targets(in.target_local, first);
    BackwardInputs tail_in = in;
    tail_in.target_local = targets;
    const TreeNode leaf{.level = 0, .index = tiles.split_tile};
    k.backward(sub_shard(f.shard, first, f.bounds.size() - first, tiles.split_tile * w),
               std::span<const TreeNode>(&leaf, 1), tail_in,
               grad_rows(grad_weight, first, f.bounds.size() - first), {}, f.exec);
  } else if (f.completes_split()) {
    // The whole tile's grad_weight in the output's dtype, of which this rank keeps its rows.
    const int64_t hs = f.shard.hidden.cols;
    const std::size_t elt = dtype_size(grad_weight.dtype);
    std::vector<std::byte> tile_gw(
        grad_weight.data != nullptr ? static_cast<std::size_t>(weights.cols * hs) * elt : 0);
    const MutableLogitsView tile_view{.data = tile_gw.empty() ? nullptr : tile_gw.data(),
                                      .dtype = grad_weight.dtype,
                                      .rows = weights.cols,
                                      .cols = hs,
                                      .row_stride = hs};
    k.backward(split_shard(f, weights), cover.last(1), tile_in, tile_view, tile_sums, f.exec);
    for (int64_t c = 0; !tile_gw.empty() && first + c < f.bounds.size(); ++c) {
      std::memcpy(static_cast<std::byte*>(grad_weight.data) +
                      static_cast<std::size_t>((first + c) * grad_weight.row_stride) * elt,
                  tile_gw.data() + static_cast<std::size_t>(c * hs) * elt,
                  static_cast<std::size_t>(hs) * elt);
    }
  }
  if (grad_weight.data != nullptr) {  // rows at or beyond the real vocabulary: exactly +0
    const int64_t real_local =
        std::clamp<int64_t>(f.shard.geometry.real_vocab - f.bounds.start, 0, f.bounds.size());
    for (int64_t c = real_local; c < f.bounds.size(); ++c) {
      std::memset(
          static_cast<std::byte*>(grad_weight.data) +
              static_cast<std::size_t>(c * grad_weight.row_stride) * dtype_size(grad_weight.dtype),
          0, static_cast<std::size_t>(f.shard.hidden.cols) * dtype_size(grad_weight.dtype));
    }
  }
}

// `v` [rows] with +0 on the rows whose `rows` entry is not `value` (empty stays empty).
std::vector<float> rows_where(std::span<const float> v, std::span<const uint8_t> rows,
                              uint8_t value) {
  std::vector<float> out(v.begin(), v.end());
  for (std::size_t r = 0; r < out.size(); ++r) {
    if (rows[r] != value) out[r] = 0.0f;
  }
  return out;
}

// Backward of a mixed batch (docs/numerics.md "Recomputed kept sets (top-k, top-p)"): the full
// backward with the restricted rows' coefficients +0 (the full rows' LSE and entropy), then the
// kept backward with the full rows' coefficients +0 (they hold no kept id). grad_hidden: each
// node's sum of a row from the pass that scores the row. grad_weight: the two passes' shards,
// each rounded to grad_weight's dtype, added in fp32 and rounded once more.
void mixed_backward(const FusedSavedForward& f, const BackwardInputs& in,
                    std::span<const TreeNode> cover, const MutableLogitsView& grad_weight,
                    std::span<float> own_sums, const op::SplitTile& weights) {
  const std::span<const uint8_t> full = f.full_rows;
  const std::vector<float> full_logp = rows_where(in.grad_logp, full, 1);
  const std::vector<float> full_lse = rows_where(in.grad_lse, full, 1);
  const std::vector<float> full_ent = rows_where(in.grad_entropy, full, 1);
  const BackwardInputs full_in{.lse = f.full_lse,
                               .entropy = f.full_entropy,
                               .target_local = in.target_local,
                               .grad_logp = full_logp,
                               .grad_lse = full_lse,
                               .grad_entropy = full_ent};
  cover_backward(f, false, cover, full_in, grad_weight, own_sums, weights);

  const std::vector<float> kept_logp = rows_where(in.grad_logp, full, 0);
  const std::vector<float> kept_lse = rows_where(in.grad_lse, full, 0);
  const std::vector<float> kept_ent = rows_where(in.grad_entropy, full, 0);
  BackwardInputs kept_in = in;
  kept_in.grad_logp = kept_logp;
  kept_in.grad_lse = kept_lse;
  kept_in.grad_entropy = kept_ent;
  std::vector<unsigned char> weight_part;
  MutableLogitsView kept_weight{};
  if (grad_weight.data != nullptr) {
    kept_weight = grad_weight;
    weight_part.resize(static_cast<std::size_t>(grad_weight.rows * grad_weight.row_stride) *
                       dtype_size(grad_weight.dtype));
    kept_weight.data = weight_part.data();
  }
  std::vector<float> kept_sums(own_sums.size());
  cover_backward(f, true, cover, kept_in, kept_weight, kept_sums, weights);

  for (int64_t c = 0; c < grad_weight.rows && grad_weight.data != nullptr; ++c) {
    for (int64_t h = 0; h < grad_weight.cols; ++h) {
      const int64_t at = c * grad_weight.row_stride + h;
      const float a = numerics::load_as_float(grad_weight.data, grad_weight.dtype, at);
      const float b = numerics::load_as_float(kept_weight.data, kept_weight.dtype, at);
      numerics::store_from_float(grad_weight.data, grad_weight.dtype, at, a + b);
    }
  }
  const int64_t rows = f.shard.hidden.rows;
  const int64_t hs = f.shard.hidden.cols;
  const auto plane = static_cast<std::size_t>(rows * hs);
  for (std::size_t j = 0; plane > 0 && j < own_sums.size() / plane; ++j) {
    for (int64_t i = 0; i < rows; ++i) {
      if (full[static_cast<std::size_t>(i)]) continue;
      const std::size_t first = j * plane + static_cast<std::size_t>(i * hs);
      std::copy_n(kept_sums.begin() + static_cast<std::ptrdiff_t>(first), hs,
                  own_sums.begin() + static_cast<std::ptrdiff_t>(first));
    }
  }
}

}  // namespace

FusedLinearLogprob::FusedLinearLogprob(std::string_view kernel, std::string backend_id)
    : FusedLinearLogprob(fused_kernels_for(kernel), std::move(backend_id)) {}

FusedLinearLogprob::FusedLinearLogprob(const FusedKernels& kernels, std::string backend_id)
    : kernels_(&kernels), backend_id_(std::move(backend_id)) {}

std::string FusedLinearLogprob::kernel_name() const { return kernels_->name(); }

std::string FusedLinearLogprob::backend_with_hidden(int64_t hidden_size) const {
  return fmt::format("{}(hidden={})", backend_id_, hidden_size);
}

FusedTraffic FusedLinearLogprob::traffic(const LogprobContract& c, int64_t hidden_size,
                                         bool entropy) {
  FusedTraffic t;
  if (c.sharding().tp_world_size() <= 1) return t;
  const std::size_t nodes = op::covers_of_all_ranks(c).widest();
  const int64_t rows = c.mask().num_tokens();
  t.preflight_bytes_per_rank = op::preflight_record_bytes();
  t.forward_payload_bytes_per_rank = op::ForwardWire(rows, nodes, entropy).block_bytes();
  t.backward_payload_bytes_per_rank =
      op::preflight_record_bytes() + static_cast<int64_t>(nodes) * rows * hidden_size * 4;
  t.forward_fragment_bytes_per_rank = op::fragment_block_bytes(c, rows * 4);
  t.backward_fragment_bytes_per_rank =
      op::fragment_block_bytes(c, hidden_size * static_cast<int64_t>(dtype_size(c.dtype())));
  return t;
}

FusedLogprobResult FusedLinearLogprob::forward(const LogitsView& hidden, const LogitsView& weight,
                                               std::span<const int64_t> targets,
                                               const LogprobContract& c, Communicator& comm,
                                               const FusedOptions& opt) const {
  const ShardingSpec& sh = c.sharding();
  const int64_t rows = hidden.rows;
  const std::string backend = backend_with_hidden(hidden.cols);
  op::PreflightFacts facts = op::call_facts(op::kFusedForwardPhase, c, backend, opt.entropy, rows);
  facts.row_temperature = opt.row_temperature;
  facts.kept = opt.kept;
  facts.top_k = opt.kept.top_k;
  facts.top_p = opt.kept.top_p;
  op::check_then_preflight(comm, sh.tp_world_size(), std::move(facts), [&] {
    if (opt.row_block <= 0) {
      throw ContractError(ErrorCode::out_of_range, "row_block",
                          fmt::format("row_block = {} must be positive", opt.row_block));
    }
    check_invocation(*kernels_, hidden, weight, targets, c, comm, opt.validate,
                     opt.row_temperature);
    op::check_recomputed_kept(opt.kept, rows);
    if (opt.kept.given()) op::check_kept_ids(opt.kept, rows, targets, c);
  });

  // This rank's node partials (its canonical cover) and the target logits it owns.
  const op::TargetOwners owners = op::target_owners(c, targets);
  auto saved = std::make_shared<FusedSavedForward>();
  FusedSavedForward& f = *saved;
  f.shard = FusedShard{.hidden = hidden,
                       .weight = weight,
                       .vocab_start = sh.local_vocab_start(),
                       .geometry = op::tile_geometry(c),
                       .temperature = c.temperature(),
                       .softcap = c.softcap().value_or(0.0f),
                       .row_block = opt.row_block};
  f.row_temperature.assign(opt.row_temperature.begin(), opt.row_temperature.end());
  f.shard.row_temperature = f.row_temperature;
  f.kernels = kernels_;
  f.backend_id = backend;
  f.tp = sh.tp_world_size();
  f.tp_rank = sh.tp_rank();
  f.covers = op::covers_of_all_ranks(c);
  f.target_local = owners.target_local;
  f.active = owners.active;
  f.has_entropy = opt.entropy;
  f.exec = opt.exec;
  f.bounds = sh.vocab_shard_bounds()[sh.tp_rank()];
  f.tiles = op::shard_tiles(f.bounds, f.shard.geometry);
  f.fragments = op::fragment_width(c) > 0;
  if (f.fragments) {  // tiles split across ranks (op/boundary_fragments.hpp)
    f.contract = c;
    if (f.tiles.split_tile >= 0) {
      const int64_t begin = f.tiles.split_tile * f.shard.geometry.tile_width;
      f.split_target =
          op::targets_in_columns(c, targets, begin, begin + f.shard.geometry.tile_width);
    }
  }
  // The full vocabulary: node partials, one all-gather, roots, logp.
  const auto full = [&] {
    const std::vector<TreeNode>& cover = f.covers.of_rank[sh.tp_rank()];
    // Unaligned bounds: first the logits of the split tiles' fragments (none when aligned).
    const op::SplitTile split =
        f.fragments ? split_tile_logits(comm, c, f, opt.exec) : op::SplitTile{};
    const std::vector<NodePartial> local = cover_partials(f, cover, split, opt.entropy, opt.exec);
    std::vector<float> target_z(static_cast<std::size_t>(rows));
    kernels_->read_target_logits(f.shard, f.target_local, target_z);

    // The logits operator's exchange: one all-gather, the roots, logp, the finite-LSE check.
    const op::ForwardWire wire(rows, f.covers.widest(), opt.entropy);
    const std::vector<float> gathered =
        op::all_gather_blocks(comm, op::pack_forward_block(wire, local, cover.size(), target_z),
                              "fused forward all-gather of the node partials");
    FusedLogprobResult out;
    out.lse.resize(static_cast<std::size_t>(rows));
    if (opt.entropy) out.entropy.resize(static_cast<std::size_t>(rows));
    op::merge_cover_roots(kernels_->shard_kernels(), f.shard.geometry, f.covers, wire, gathered,
                          rows, RootsOut{.lse = out.lse, .entropy = out.entropy}, opt.exec);
    out.logp = op::selected_logps(wire, gathered, owners, out.lse);
    if (opt.validate) op::check_finite_lse(c.mask().active_mask(), out.lse, "hidden");
    return out;
  };

  // Kept sets, given or recomputed (docs/numerics.md "Recomputed kept sets (top-k, top-p)"): the
  // full roots first where top-p needs the row's LSE, then the selection, the same ids on every
  // rank; rows of only -1 in a mixed batch take the full outputs.
  const op::KeptSelectionParams params = op::selection_params(opt.kept);
  const bool recompute = op::restricts_rows(params, rows);
  if (opt.kept.given() || recompute) {  // only the kept scores: no node partials of the vocabulary
    std::optional<FusedLogprobResult> full_out;
    if (recompute) {
      if (op::needs_full_lse(params, rows)) full_out = full();
      op::KeptSelection selected = op::select_kept_sets_of_fused(
          comm, *kernels_, f.shard, params,
          full_out ? std::span<const float>(full_out->lse) : std::span<const float>{}, opt.exec);
      f.kept = std::move(selected.ids);
      f.kept_width = selected.width;
    } else {
      f.kept = op::resolve_kept_ids(opt.kept.ids, rows, opt.kept.width);
      f.kept_width = opt.kept.width;
    }
    if (recompute || opt.kept.empty_rows == EmptyKeptRow::full_vocabulary) {
      f.full_rows = op::full_vocabulary_rows(f.kept, rows, f.kept_width);
    }
    if (!op::any_row(f.full_rows)) {
      f.full_rows.clear();
    } else if (!full_out) {
      full_out = full();
    }
    op::KeptOutputs kept =
        op::kept_forward(comm, sh, kernels_->shard_kernels(), f.kept, f.kept_width, targets,
                         f.active, opt.entropy, op::read_scores_of(*kernels_, f.shard), opt.exec);
    if (!f.full_rows.empty()) {
      op::take_full_rows(f.full_rows, full_out->logp, full_out->lse, full_out->entropy, kept);
      f.full_lse = std::move(full_out->lse);
      f.full_entropy = std::move(full_out->entropy);
    }
    if (opt.validate) op::check_finite_lse(c.mask().active_mask(), kept.lse, "hidden");
    FusedLogprobResult out;
    out.logp = std::move(kept.logp);
    out.lse = std::move(kept.lse);
    out.entropy = std::move(kept.entropy);
    out.kept_ids = f.kept;
    out.kept_width = f.kept_width;
    f.outside_kept = std::move(kept.outside);
    if (recompute) op::check_targets_selected(f.outside_kept, targets, opt.kept.outside);
    f.lse = out.lse;
    f.entropy = out.entropy;
    out.saved = std::move(saved);
    return out;
  }
  FusedLogprobResult out = full();
  f.lse = out.lse;
  f.entropy = out.entropy;
  out.saved = std::move(saved);
  return out;
}

void FusedLinearLogprob::backward(const FusedLogprobResult& fwd, const LogprobGrads& g,
                                  const MutableLogitsView& grad_hidden,
                                  const MutableLogitsView& grad_weight, Communicator& comm) const {
  if (!fwd.saved) {
    throw ContractError(
        ErrorCode::mode_mismatch, "fwd",
        "backward needs the FusedLogprobResult of a forward call (its saved state is empty)");
  }
  const FusedSavedForward& f = *fwd.saved;
  const int64_t rows = f.shard.hidden.rows;
  const int64_t hs = f.shard.hidden.cols;
  const bool want_hidden = grad_hidden.data != nullptr;
  const bool want_weight = grad_weight.data != nullptr;

  // The grad_hidden exchange is a collective: every rank must agree to run it.
  op::PreflightFacts facts;
  facts.phase = op::kFusedBackwardPhase;
  facts.fingerprint = "fused-backward";
  facts.backend_id = f.backend_id;
  facts.numerics_version = std::string(kNumericsVersion);
  facts.tile_width = f.shard.geometry.tile_width;
  facts.entropy = want_hidden;  // decides whether the grad_hidden all-gather runs
  facts.rows = rows;
  op::check_then_preflight(comm, f.tp, std::move(facts), [&] {
    if (f.backend_id != backend_with_hidden(hs)) {
      throw ContractError(
          ErrorCode::mode_mismatch, "fwd",
          fmt::format("{}: backward was given the result of another operator's forward ({}); "
                      "call backward on the operator that ran forward",
                      backend_id_, f.backend_id));
    }
    op::check_grads(g, rows, f.has_entropy);
    check_gradient_view(grad_hidden, f.shard.hidden, "grad_hidden");
    check_gradient_view(grad_weight, f.shard.weight, "grad_weight");
    if (comm.size() != f.tp || comm.rank() != f.tp_rank) {
      throw ContractError(
          ErrorCode::communicator_mismatch, "comm",
          fmt::format("backward's communicator (rank {} of {}) is not forward's (rank {} of {}); "
                      "pass the same TP group",
                      comm.rank(), comm.size(), f.tp_rank, f.tp));
    }
  });
  if (!want_hidden && !want_weight) return;

  // This rank's grad_weight and the grad_hidden sum of each node of its cover, padded to the
  // widest cover so that every rank sends a block of the same size.
  std::vector<float> g_logp = op::active_grad_logp(g.grad_logp, f.active);
  op::drop_outside_grad_logp(g_logp, f.outside_kept);
  const BackwardInputs in{.lse = f.lse,
                          .entropy = f.entropy,
                          .target_local = f.target_local,
                          .grad_logp = g_logp,
                          .grad_lse = g.grad_lse,
                          .grad_entropy = g.grad_entropy};
  const std::vector<TreeNode>& cover = f.covers.of_rank[f.tp_rank];
  const std::size_t width = f.covers.widest();
  const auto plane = static_cast<std::size_t>(rows * hs);  // one [rows, H] sum
  std::vector<float> send(want_hidden ? width * plane : 0, 0.0f);
  const std::span<float> own_sums =
      std::span<float>(send).first(want_hidden ? cover.size() * plane : 0);
  // Shard bounds that split tiles: the fragments' weight rows, for the split tiles' grad_hidden
  // chains (every rank alike: want_hidden is in the preflight).
  const op::SplitTile weights =
      f.fragments && want_hidden ? op::exchange_weight_fragments(comm, *f.contract, f.shard.weight)
                                 : op::SplitTile{};
  if (!f.full_rows.empty()) {
    mixed_backward(f, in, cover, grad_weight, own_sums, weights);
  } else {
    cover_backward(f, f.kept_width > 0, cover, in, grad_weight, own_sums, weights);
  }
  if (!want_hidden) return;

  // Every rank's node sums, merged by the canonical tree on every rank alike.
  std::vector<float> gathered = op::all_gather_blocks(
      comm, std::move(send), "fused backward all-gather of the grad_hidden partials");
  std::vector<float*> sums;
  for (std::size_t r = 0; r < f.covers.of_rank.size(); ++r) {
    for (std::size_t j = 0; j < f.covers.of_rank[r].size(); ++j) {
      sums.push_back(gathered.data() + (r * width + j) * plane);
    }
  }
  f.kernels->merge_hidden_sums(f.covers.all(), sums, grad_hidden);
}

}  // namespace detlogp
