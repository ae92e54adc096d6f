// VocabParallelLogprob: validation, preflight, one all-gather, root rebuild, backward.
// The arithmetic lives in the kernels and in numerics/canon.hpp; this file only decides who
// computes which node and moves bytes.

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "detlogp/operator.hpp"
#include "numerics/canon.hpp"
#include "op/boundary_fragments.hpp"
#include "op/call_checks.hpp"
#include "op/forward_exchange.hpp"
#include "op/full_vocabulary_rows.hpp"
#include "op/kept_selection.hpp"
#include "op/kept_sets.hpp"
#include "op/preflight.hpp"
#include "op/saved_forward.hpp"

namespace detlogp {

namespace {

// The inputs' shapes and dtype against the contract (the invocation checks that come before
// the communicator's; docs/operator.md, "What forward does"), as ContractError.
void check_input_shapes(const LogitsView& logits, std::span<const int64_t> targets,
                        const LogprobContract& c) {
  // A rank that holds no columns may pass a view without data.
  if (logits.rows < 0 || logits.cols < 0 ||
      (logits.rows > 0 && logits.cols > 0 && logits.data == nullptr)) {
    throw ContractError(
        ErrorCode::wrong_shape, "local_logits",
        fmt::format(
            "local_logits must be 2-D [num_tokens, local_vocab] with data; got rows={} cols={}",
            logits.rows, logits.cols));
  }
  if (logits.row_stride < logits.cols) {
    throw ContractError(ErrorCode::wrong_shape, "local_logits",
                        fmt::format("local_logits row_stride={} is smaller than its {} columns; "
                                    "pass the stride in elements",
                                    logits.row_stride, logits.cols));
  }
  op::check_one_target_per_row(targets, logits.rows, "logits");
  op::check_local_vocab(logits.cols, "local_logits", "vocab columns", c);
  op::check_num_tokens(logits.rows, "local_logits", c);
  op::check_dtype(logits.dtype, "local_logits", c);
}

// The invocation checks, as ContractError: the inputs' shapes and dtype (check_input_shapes),
// the per-row temperatures, then the transport, then the active targets against the real
// vocabulary.
void check_invocation(const LogitsView& logits, std::span<const int64_t> targets,
                      const LogprobContract& c, const Communicator& comm, bool validate,
                      std::span<const float> row_temperature) {
  check_input_shapes(logits, targets, c);
  op::check_row_temperature(row_temperature, logits.rows, c);
  op::check_transport_and_targets(comm, targets, c, validate);
}

// The mode checks, which run first (docs/operator.md, "What forward does"). Any shard bounds
// are fine on kernels that support them: tiles split across ranks are completed by their owners
// (op/boundary_fragments.hpp).
void check_mode(const LogprobContract& c, bool deterministic, const ShardKernels* kernels) {
  if (deterministic && kernels != nullptr && !kernels->supports_unaligned_bounds()) {
    if (auto problem = tile_alignment_problem(c)) {
      throw ContractError(ErrorCode::tile_misaligned, "vocab_shard_bounds",
                          *problem + ". The kernels " + kernels->name() +
                              " do not; fix: align every bound to a multiple of the tile "
                              "width, or run on the CPU kernels");
    }
  }
  if (!deterministic && c.reduction().determinism_scope() == DeterminismScope::cross_tp_bitwise) {
    throw ContractError(
        ErrorCode::mode_mismatch, "deterministic",
        "deterministic=false cannot honour determinism_scope=cross_tp_bitwise (its merge order "
        "depends on the shard layout); pass deterministic=true or build the contract with "
        "determinism_scope=fixed_topology");
  }
}

// The non-deterministic mode reduces this rank's shard as if it started at column 0: local
// tiles of W from the shard's first column, real columns up to R.
ShardSpec local_spec(const LogprobContract& c) {
  const ShardingSpec& sh = c.sharding();
  const int64_t real_local =
      std::clamp<int64_t>(sh.real_vocab_size() - sh.local_vocab_start(), 0, sh.local_vocab_size());
  return ShardSpec{.vocab_start = 0,
                   .geometry = {.real_vocab = real_local, .tile_width = c.tile_width()},
                   .temperature = c.temperature(),
                   .softcap = c.softcap().value_or(0.0f)};
}

// This rank's node partials in deterministic mode, [rows][nodes] for the nodes of its canonical
// node set (op::covers_of_all_ranks): the cover of its full tiles computed from the shard itself
// (a view starting at the first full tile), then its split tile, if any, from the tile assembled
// out of the boundary fragments (op/boundary_fragments.hpp).
std::vector<NodePartial> canonical_node_partials(const ShardKernels& kernels,
                                                 const LogitsView& logits, const ShardSpec& spec,
                                                 const VocabRange& bounds,
                                                 std::span<const TreeNode> nodes,
                                                 const op::SplitTile& split, bool entropy,
                                                 const ExecOptions& exec) {
  const int64_t rows = logits.rows;
  const op::ShardTiles tiles = op::shard_tiles(bounds, spec.geometry);
  const std::size_t full = tiles.split_tile >= 0 ? nodes.size() - 1 : nodes.size();
  std::vector<NodePartial> out(static_cast<std::size_t>(rows) * full);
  if (full > 0) {
    const op::FullTiles f = op::full_tiles_of(tiles, bounds, spec.geometry.tile_width);
    LogitsView view = logits;
    view.data = static_cast<const std::byte*>(logits.data) +
                static_cast<std::size_t>(f.skip) * dtype_size(logits.dtype);
    view.cols = f.cols;
    ShardSpec full_spec = spec;
    full_spec.vocab_start = f.start;
    kernels.node_partials(view, full_spec, nodes.first(full), entropy, out, exec);
  }
  std::vector<NodePartial> part;
  if (tiles.split_tile >= 0) {
    ShardSpec tile_spec = spec;
    tile_spec.vocab_start = split.vocab_start;
    part.resize(static_cast<std::size_t>(rows));
    kernels.node_partials(split.view, tile_spec, nodes.last(1), entropy, part, exec);
  }
  return op::join_split_partials(std::move(out), full, part, rows);
}

// Each row's node partials folded left to right into one (the non-deterministic per-shard
// reduction): [rows][nodes] -> [rows][1].
std::vector<NodePartial> fold_rows(const std::vector<NodePartial>& partials, int64_t rows,
                                   std::size_t nodes, bool entropy) {
  std::vector<NodePartial> folded(static_cast<std::size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    canon::Partial acc = canon::identity_partial();
    for (std::size_t j = 0; j < nodes; ++j)
      acc = canon::merge(acc, partials[i * nodes + j], entropy);
    folded[i] = acc;
  }
  return folded;
}

}  // namespace

void check_forward_inputs(const LogitsView& local_logits, std::span<const int64_t> targets,
                          const LogprobContract& contract, const ForwardOptions& options) {
  check_mode(contract, options.deterministic, nullptr);
  check_input_shapes(local_logits, targets, contract);
  op::check_row_temperature(options.row_temperature, local_logits.rows, contract);
}

void fail_preflight(Communicator& comm, const std::string& message) {
  if (comm.size() > 1) {
    op::PreflightFacts facts;
    facts.local_error = message;
    op::run_preflight(comm, facts);  // throws on every rank, this one with `message`
  }
  throw ContractError(message);
}

void preflight_no_tokens(Communicator& comm) {
  if (comm.size() > 1) {
    op::PreflightFacts facts;  // zero rows, no contract: agrees only with other empty ranks
    op::run_preflight(comm, facts);
  }
}

LogitsView saved_logits(const LogprobResult& result) {
  return result.saved ? result.saved->logits : LogitsView{};
}

VocabParallelLogprob::VocabParallelLogprob(const ShardKernels& kernels, std::string backend_id)
    : kernels_(kernels), backend_id_(std::move(backend_id)) {}

ForwardTraffic VocabParallelLogprob::traffic(const LogprobContract& c, bool deterministic) {
  const int64_t rows = c.mask().num_tokens();
  const std::size_t nodes = deterministic ? op::covers_of_all_ranks(c).widest() : 1;
  ForwardTraffic t;
  if (c.sharding().tp_world_size() > 1) {
    t.preflight_bytes_per_rank = op::preflight_record_bytes();
    // Entropy adds a third float per node; report the larger (entropy) payload.
    t.payload_bytes_per_rank = op::ForwardWire(rows, nodes, true).block_bytes();
    if (deterministic) {
      t.fragment_bytes_per_rank =
          op::fragment_block_bytes(c, rows * static_cast<int64_t>(dtype_size(c.dtype())));
    }
  }
  return t;
}

LogprobResult VocabParallelLogprob::forward(const LogitsView& logits,
                                            std::span<const int64_t> targets,
                                            const LogprobContract& c, Communicator& comm,
                                            const ForwardOptions& opt) const {
  const ShardingSpec& sh = c.sharding();
  const int64_t rows = logits.rows;

  // 1-2. Local checks, then the preflight (which also compares the contract's parts, the
  //      targets and the rows layout).
  op::PreflightFacts facts = op::call_facts(op::kForwardPhase, c, backend_id_, opt.entropy, rows);
  if (!opt.deterministic) {  // tiles unused: the local range in columns
    facts.tile_width = 0;
    facts.deterministic = false;
    facts.local_begin = sh.local_vocab_start();
    facts.local_end = sh.local_vocab_end();
  }
  facts.rows_layout = opt.rows_layout;
  facts.contract = &c;
  facts.targets = targets;
  facts.row_temperature = opt.row_temperature;
  facts.kept = opt.kept;
  facts.top_k = opt.kept.top_k;
  facts.top_p = opt.kept.top_p;
  op::check_then_preflight(comm, sh.tp_world_size(), std::move(facts), [&] {
    check_mode(c, opt.deterministic, &kernels_);
    check_invocation(logits, targets, c, comm, opt.validate, opt.row_temperature);
    if (opt.kept.given() || opt.kept.recomputed()) {
      if (!kernels_.supports_kept_sets()) {
        const char* field = opt.kept.given() ? "kept_ids" : "top_k";
        throw ContractError(ErrorCode::not_supported, field,
                            fmt::format("{} ({}) has no kept sets (supports_kept_sets false); "
                                        "call without {} or use a CPU backend",
                                        backend_id_, kernels_.name(),
                                        opt.kept.given() ? "kept_ids" : "top_k/top_p"));
      }
      op::check_recomputed_kept(opt.kept, rows);
      if (opt.kept.given()) op::check_kept_ids(opt.kept, rows, targets, c);
    }
  });

  // 3. This rank's node partials and its copies of the targets it owns. Deterministic: the
  //    nodes of its canonical cover. Non-deterministic: its cover folded into one partial.
  op::TargetOwners owners = op::target_owners(c, targets);
  auto saved = std::make_shared<SavedForward>();
  saved->logits = logits;
  saved->producer = SavedForward::Producer::vocab_parallel;
  saved->kernels = &kernels_;
  saved->has_entropy = opt.entropy;
  saved->entropy_grad = opt.entropy && opt.entropy_grad;
  saved->exec = opt.exec;
  saved->active = owners.active;
  saved->target_local = owners.target_local;

  const op::Covers covers = opt.deterministic ? op::covers_of_all_ranks(c) : op::Covers{};
  std::vector<TreeNode> local_nodes;
  if (opt.deterministic) {
    saved->spec = ShardSpec{.vocab_start = sh.local_vocab_start(),
                            .geometry = op::tile_geometry(c),
                            .temperature = c.temperature(),
                            .softcap = c.softcap().value_or(0.0f)};
    local_nodes = covers.of_rank[sh.tp_rank()];
  } else {
    saved->spec = local_spec(c);
    local_nodes = canonical_cover(saved->spec.geometry, 0,
                                  op::ceil_div(sh.local_vocab_size(), c.tile_width()));
  }
  saved->row_temperature.assign(opt.row_temperature.begin(), opt.row_temperature.end());
  saved->spec.row_temperature = saved->row_temperature;
  // 3-7. The full vocabulary: node partials, one all-gather, roots, logp.
  const auto full = [&](std::shared_ptr<SavedForward> saved) {
    std::vector<NodePartial> local(static_cast<std::size_t>(rows) * local_nodes.size());
    if (opt.deterministic) {
      // Unaligned bounds: first the boundary fragments of the split tiles (none when aligned).
      const op::SplitTile split =
          op::fragment_width(c) > 0 ? op::exchange_fragments(comm, c, logits) : op::SplitTile{};
      local = canonical_node_partials(kernels_, logits, saved->spec,
                                      sh.vocab_shard_bounds()[sh.tp_rank()], local_nodes, split,
                                      opt.entropy, opt.exec);
    } else if (!local_nodes.empty()) {
      kernels_.node_partials(logits, saved->spec, local_nodes, opt.entropy, local, opt.exec);
    }
    if (!opt.deterministic) local = fold_rows(local, rows, local_nodes.size(), opt.entropy);
    std::vector<float> target_z(static_cast<std::size_t>(rows));
    kernels_.read_target_logits(logits, saved->spec, saved->target_local, target_z);

    // 4. This rank's block of the all-gather (op/forward_wire.hpp); one all-gather.
    const op::ForwardWire wire(rows, opt.deterministic ? covers.widest() : 1, opt.entropy);
    const std::vector<float> gathered = op::all_gather_blocks(
        comm,
        op::pack_forward_block(wire, local, opt.deterministic ? local_nodes.size() : 1, target_z),
        "forward all-gather of the node partials");

    // 5. Roots. Deterministic: every rank's cover nodes in rank order, one merge by the tree.
    //    Non-deterministic: one partial per rank, folded in rank order.
    LogprobResult out;
    out.lse.resize(static_cast<std::size_t>(rows));
    if (opt.entropy) out.entropy.resize(static_cast<std::size_t>(rows));
    if (opt.deterministic) {
      op::merge_cover_roots(kernels_, saved->spec.geometry, covers, wire, gathered, rows,
                            RootsOut{.lse = out.lse, .entropy = out.entropy}, opt.exec);
    } else {
      for (int64_t i = 0; i < rows; ++i) {
        canon::Partial acc = canon::identity_partial();
        for (int64_t r = 0; r < sh.tp_world_size(); ++r) {
          acc = canon::merge(acc, wire.partial(wire.block_of(gathered, r), i, 0), opt.entropy);
        }
        const canon::RootValues root = canon::finish_root(acc);
        out.lse[i] = root.lse;
        if (opt.entropy) out.entropy[i] = root.entropy;
      }
    }

    // 6. logp: the target logit is copied from its owner's block, never summed.
    out.logp = op::selected_logps(wire, gathered, owners, out.lse);

    // 7. Active rows must have a finite LSE (checked after compute, identically on every rank).
    if (opt.validate) op::check_finite_lse(c.mask().active_mask(), out.lse, "local_logits");
    saved->lse = out.lse;
    if (saved->entropy_grad) saved->entropy = out.entropy;  // backward's only use of it
    out.saved = std::move(saved);
    return out;
  };

  // Kept sets, given or recomputed (docs/numerics.md "Recomputed kept sets (top-k, top-p)"): the
  // full roots first where top-p needs the row's LSE, the selection (the same ids on every rank),
  // then the kept forward over the ids; rows of only -1 in a mixed batch take the full outputs.
  const op::KeptSelectionParams params = op::selection_params(opt.kept);
  const bool recompute = op::restricts_rows(params, rows);
  if (!opt.kept.given() && !recompute) return full(std::move(saved));
  std::optional<LogprobResult> full_out;
  std::vector<int64_t> ids;
  int64_t width = opt.kept.width;
  if (recompute) {
    if (op::needs_full_lse(params, rows)) full_out = full(std::make_shared<SavedForward>(*saved));
    op::KeptSelection selected = op::select_kept_sets_of_logits(
        comm, kernels_, c, logits, opt.row_temperature, params,
        full_out ? std::span<const float>(full_out->lse) : std::span<const float>{}, opt.exec);
    ids = std::move(selected.ids);
    width = selected.width;
  } else {
    ids = op::resolve_kept_ids(opt.kept.ids, rows, width);
  }
  if (recompute || opt.kept.empty_rows == EmptyKeptRow::full_vocabulary) {
    saved->full_rows = op::full_vocabulary_rows(ids, rows, width);
  }
  if (op::any_row(saved->full_rows) && !full_out) {
    full_out = full(std::make_shared<SavedForward>(*saved));
  }
  saved->kept = std::move(ids);
  saved->kept_width = width;
  LogprobResult out = forward_kept(logits, targets, c, comm, opt, std::move(saved),
                                   full_out ? &*full_out : nullptr);
  if (recompute) op::check_targets_selected(out.saved->outside_kept, targets, opt.kept.outside);
  return out;
}

// Forward over kept sets (docs/numerics.md "Kept sets"): no node partials of the vocabulary,
// only the kept scores, one all-gather of [rows, width] floats.
LogprobResult VocabParallelLogprob::forward_kept(const LogitsView& logits,
                                                 std::span<const int64_t> targets,
                                                 const LogprobContract& c, Communicator& comm,
                                                 const ForwardOptions& opt,
                                                 std::shared_ptr<SavedForward> saved,
                                                 const LogprobResult* full) const {
  const ShardingSpec& sh = c.sharding();
  const int64_t width = saved->kept_width;
  saved->kept_begin = sh.local_vocab_start();
  saved->real_vocab = sh.real_vocab_size();
  const ShardSpec& spec = saved->spec;
  op::KeptOutputs kept =
      op::kept_forward(comm, sh, kernels_, saved->kept, width, targets, saved->active, opt.entropy,
                       op::read_scores_of(logits, spec), opt.exec);
  if (full != nullptr) {
    op::take_full_rows(saved->full_rows, full->logp, full->lse, full->entropy, kept);
  }
  if (opt.validate) op::check_finite_lse(c.mask().active_mask(), kept.lse, "local_logits");
  LogprobResult out;
  out.logp = std::move(kept.logp);
  out.lse = std::move(kept.lse);
  out.entropy = std::move(kept.entropy);
  out.kept_ids = saved->kept;
  out.kept_width = width;
  saved->outside_kept = std::move(kept.outside);
  saved->lse = out.lse;
  if (saved->entropy_grad) saved->entropy = out.entropy;
  out.saved = std::move(saved);
  return out;
}

void VocabParallelLogprob::backward(const LogprobResult& fwd, const LogprobGrads& g,
                                    const MutableLogitsView& grad) const {
  const SavedForward& s =
      op::saved_state_of(fwd, SavedForward::Producer::vocab_parallel, backend_id_);
  const int64_t rows = s.logits.rows;
  op::check_grads(g, rows, s.has_entropy);
  if (!g.grad_entropy.empty() && !s.entropy_grad) {
    throw ContractError(
        ErrorCode::mode_mismatch, "grad_entropy",
        "grad_entropy was given but forward ran with entropy_grad=false (the entropy is a "
        "constant for backward); run forward with entropy_grad=true to differentiate it");
  }
  op::check_logits_grad(grad, s.logits);
  // Inactive rows get no logp gradient (but do get the LSE and entropy gradients).
  std::vector<float> g_logp = op::active_grad_logp(g.grad_logp, s.active);
  // LSE and entropy from the saved copies: the result's public vectors may have been moved.
  BackwardInputs in{.lse = s.lse,
                    .entropy = s.entropy,
                    .target_local = s.target_local,
                    .grad_logp = g_logp,
                    .grad_lse = g.grad_lse,
                    .grad_entropy = g.grad_entropy};
  if (s.kept_width > 0) {
    op::drop_outside_grad_logp(g_logp, s.outside_kept);
    // A mixed batch: every row by the full backward (the saved LSE and entropy are the full ones
    // on full rows), then the restricted rows overwritten by the kept backward.
    if (op::any_row(s.full_rows)) s.kernels->backward(s.logits, s.spec, in, grad, s.exec);
    op::kept_backward(s.logits, s.spec, s.kept, s.kept_width, s.kept_begin, s.real_vocab, in, grad,
                      s.full_rows);
    return;
  }
  s.kernels->backward(s.logits, s.spec, in, grad, s.exec);
}

}  // namespace detlogp
