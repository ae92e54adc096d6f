// FusedLinearLogprob: the vocab-parallel logprob straight from hidden states and a weight shard.
// The fused kernels (FusedKernels) produce this rank's node partials and target logits from
// hidden x weight, tile by tile; from there on it is the logits operator's protocol
// (op/call_checks.hpp, op/preflight.hpp, op/forward_exchange.hpp): checks and preflight, one
// all-gather, the roots by the canonical tree, logp. Backward has the kernels produce this
// rank's grad_weight and the grad_hidden sum of each node of its cover; one all-gather moves
// every rank's node sums, and each rank merges them by the same tree.
#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "detlogp/fused.hpp"
#include "detlogp/version.hpp"
#include "numerics/element_io.hpp"
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
};

namespace {

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
                    std::span<float> own_sums) {
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
  f.kernels->backward(f.shard, cover, full_in, grad_weight, own_sums, f.exec);

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
  f.kernels->kept_backward(f.shard, f.kept, f.kept_width, cover, kept_in, kept_weight, kept_sums);

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

// The inputs' shapes and dtypes against the contract, then the transport and the targets.
void check_invocation(const LogitsView& hidden, const LogitsView& weight,
                      std::span<const int64_t> targets, const LogprobContract& c,
                      const Communicator& comm, bool validate,
                      std::span<const float> row_temperature) {
  if (auto problem = tile_alignment_problem(c)) {
    throw ContractError(ErrorCode::tile_misaligned, "vocab_shard_bounds",
                        *problem +
                            ". Fix: align every bound to a multiple of the tile width, "
                            "or compute the logits and call the logits op "
                            "(VocabParallelLogprob)");
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
    check_invocation(hidden, weight, targets, c, comm, opt.validate, opt.row_temperature);
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
  // The full vocabulary: node partials, one all-gather, roots, logp.
  const auto full = [&] {
    const std::vector<TreeNode>& cover = f.covers.of_rank[sh.tp_rank()];
    std::vector<NodePartial> local(static_cast<std::size_t>(rows) * cover.size());
    kernels_->node_partials(f.shard, cover, opt.entropy, local, opt.exec);
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
  if (!f.full_rows.empty()) {
    mixed_backward(f, in, cover, grad_weight, own_sums);
  } else if (f.kept_width > 0) {
    f.kernels->kept_backward(f.shard, f.kept, f.kept_width, cover, in, grad_weight, own_sums);
  } else {
    f.kernels->backward(f.shard, cover, in, grad_weight, own_sums, f.exec);
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
