// VocabParallelLogprob: validation, preflight, one all-gather, root rebuild, backward.
// The arithmetic lives in the kernels and in numerics/canon.hpp; this file only decides who
// computes which node and moves bytes.

#include <algorithm>
#include <cstring>
#include <exception>
#include <optional>

#include <fmt/format.h>

#include "detlogp/operator.hpp"
#include "detlogp/version.hpp"
#include "numerics/canon.hpp"
#include "op/forward_wire.hpp"
#include "op/preflight.hpp"
#include "op/saved_forward.hpp"

namespace detlogp {

namespace {

std::string dtype_name(DType d) { return std::string(to_string(d)); }

// The inputs' shapes and dtype against the contract (the invocation checks that come before
// the communicator's; docs/operator.md, "What forward does"), as ContractError.
void check_input_shapes(const LogitsView& logits, std::span<const int64_t> targets,
                        const LogprobContract& c) {
  const ShardingSpec& sh = c.sharding();
  if (logits.rows < 0 || logits.cols < 0 || (logits.rows > 0 && logits.data == nullptr)) {
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
  if (static_cast<int64_t>(targets.size()) != logits.rows) {
    throw ContractError(
        ErrorCode::wrong_shape, "target_ids",
        fmt::format(
            "target_ids must be 1-D with one entry per token: got {} targets for {} logits rows",
            targets.size(), logits.rows));
  }
  if (logits.cols != sh.local_vocab_size()) {
    throw ContractError(
        ErrorCode::wrong_shape, "local_logits",
        fmt::format(
            "local_logits has {} vocab columns but the contract declares local shard [{}, {}) of "
            "size {}",
            logits.cols, sh.local_vocab_start(), sh.local_vocab_end(), sh.local_vocab_size()));
  }
  if (logits.rows != c.mask().num_tokens()) {
    throw ContractError(
        ErrorCode::wrong_shape, "local_logits",
        fmt::format("local_logits has {} rows but the contract's MaskSpec declares num_tokens={}",
                    logits.rows, c.mask().num_tokens()));
  }
  if (logits.dtype != c.dtype()) {
    throw ContractError(ErrorCode::wrong_dtype, "local_logits",
                        fmt::format("local_logits dtype {} does not match the contract dtype {}",
                                    dtype_name(logits.dtype), dtype_name(c.dtype())));
  }
}

// The invocation checks, as ContractError: the inputs' shapes and dtype (check_input_shapes),
// then the transport, then the active targets against the real vocabulary.
void check_invocation(const LogitsView& logits, std::span<const int64_t> targets,
                      const LogprobContract& c, const Communicator& comm, bool validate) {
  check_input_shapes(logits, targets, c);
  const ShardingSpec& sh = c.sharding();
  if (comm.size() != sh.tp_world_size()) {
    throw ContractError(
        ErrorCode::communicator_mismatch, "tp_world_size",
        fmt::format(
            "the communicator has {} ranks but the contract declares tp_world_size={}; pass the TP "
            "subgroup, not the global group",
            comm.size(), sh.tp_world_size()));
  }
  if (comm.rank() != sh.tp_rank()) {
    throw ContractError(ErrorCode::communicator_mismatch, "tp_rank",
                        fmt::format("tp_group rank {} does not match the contract tp_rank={}",
                                    comm.rank(), sh.tp_rank()));
  }
  if (validate) {
    const auto& active = c.mask().active_mask();
    bool bad = false;
    int64_t lo = 0, hi = 0;
    for (std::size_t i = 0; i < targets.size(); ++i) {
      if (!active[i]) continue;
      const int64_t t = targets[i];
      if (t < 0 || t >= sh.real_vocab_size()) {
        lo = bad ? std::min(lo, t) : t;
        hi = bad ? std::max(hi, t) : t;
        bad = true;
      }
    }
    if (bad) {
      throw ContractError(ErrorCode::token_out_of_vocab, "target_ids",
                          fmt::format("active target_ids must lie in the real vocabulary [0, {}); "
                                      "got values in [{}, {}] on active rows",
                                      sh.real_vocab_size(), lo, hi));
    }
  }
}

// The mode checks, which run first (docs/operator.md, "What forward does").
void check_mode(const LogprobContract& c, bool deterministic) {
  if (deterministic) {
    c.check_tile_alignment();
  } else if (c.reduction().determinism_scope() == DeterminismScope::cross_tp_bitwise) {
    throw ContractError(
        ErrorCode::mode_mismatch, "deterministic",
        "deterministic=false cannot honour determinism_scope=cross_tp_bitwise (its merge order "
        "depends on the shard layout); pass deterministic=true or build the contract with "
        "determinism_scope=fixed_topology");
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }  // no overflow

// Tiles of a rank's shard in the deterministic mode.
std::pair<int64_t, int64_t> tile_range(const VocabRange& bounds, int64_t w) {
  return {bounds.start / w, ceil_div(bounds.end, w)};
}

// Node lists per rank: the canonical cover of each rank's tiles (deterministic), computed by
// every rank from the contract, so every rank knows every rank's payload layout.
std::vector<std::vector<TreeNode>> covers_of_all_ranks(const LogprobContract& c,
                                                       const TileGeometry& g) {
  std::vector<std::vector<TreeNode>> covers;
  for (const VocabRange& b : c.sharding().vocab_shard_bounds()) {
    auto [a, e] = tile_range(b, g.tile_width);
    covers.push_back(canonical_cover(g, a, e));
  }
  return covers;
}

std::size_t max_cover(const std::vector<std::vector<TreeNode>>& covers) {
  std::size_t m = 0;
  for (const auto& c : covers) m = std::max(m, c.size());
  return m;
}

// The non-deterministic mode reduces this rank's shard as if it started at column 0: local
// tiles of W from the shard's first column, real columns up to R.
ShardSpec local_spec(const LogprobContract& c) {
  const ShardingSpec& sh = c.sharding();
  const int64_t real_local =
      std::clamp<int64_t>(sh.real_vocab_size() - sh.local_vocab_start(), 0, sh.local_vocab_size());
  return ShardSpec{.vocab_start = 0,
                   .geometry = {.real_vocab = real_local, .tile_width = c.tile_width()},
                   .temperature = c.temperature()};
}

// Left fold of a row's node partials (the non-deterministic per-shard reduction).
canon::Partial fold(const NodePartial* p, std::size_t n, bool entropy) {
  canon::Partial acc = canon::identity_partial();
  for (std::size_t j = 0; j < n; ++j) {
    acc = canon::merge(acc, p[j], entropy);
  }
  return acc;
}

}  // namespace

void check_forward_inputs(const LogitsView& local_logits, std::span<const int64_t> targets,
                          const LogprobContract& contract, const ForwardOptions& options) {
  check_mode(contract, options.deterministic);
  check_input_shapes(local_logits, targets, contract);
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
  const TileGeometry g{.real_vocab = c.sharding().real_vocab_size(), .tile_width = c.tile_width()};
  const int64_t rows = c.mask().num_tokens();
  const int64_t nodes =
      deterministic ? static_cast<int64_t>(max_cover(covers_of_all_ranks(c, g))) : 1;
  ForwardTraffic t;
  if (c.sharding().tp_world_size() > 1) {
    t.preflight_bytes_per_rank = op::preflight_record_bytes();
    // Entropy adds a third float per node; report the larger (entropy) payload.
    t.payload_bytes_per_rank =
        op::ForwardWire(rows, static_cast<std::size_t>(nodes), true).block_bytes();
  }
  return t;
}

LogprobResult VocabParallelLogprob::forward(const LogitsView& logits,
                                            std::span<const int64_t> targets,
                                            const LogprobContract& c, Communicator& comm,
                                            const ForwardOptions& opt) const {
  const ShardingSpec& sh = c.sharding();
  const int64_t tp = sh.tp_world_size();
  const int64_t rows = logits.rows;
  const int64_t w = c.tile_width();
  const TileGeometry geometry{.real_vocab = sh.real_vocab_size(), .tile_width = w};

  // 1. Local checks. With TP > 1 a local failure is not thrown yet: it travels in the
  //    preflight so that the other ranks fail with it instead of waiting for this one.
  std::optional<std::string> local_error;
  std::exception_ptr local_exception;  // rethrown here with its code and field
  try {
    check_mode(c, opt.deterministic);
    check_invocation(logits, targets, c, comm, opt.validate);
  } catch (const ContractError& e) {
    if (comm.size() == 1) throw;
    local_error = e.what();
    local_exception = std::current_exception();
  }

  // 2. Preflight: whenever TP > 1, whatever `validate` says (and whenever the communicator has
  //    several ranks, so that a rank whose contract says TP=1 fails together with the others).
  if (tp > 1 || comm.size() > 1) {
    op::PreflightFacts facts;
    facts.phase = op::kForwardPhase;
    facts.fingerprint = c.cross_rank_fingerprint();
    facts.backend_id = backend_id_;
    facts.numerics_version = std::string(kNumericsVersion);
    facts.tile_width = opt.deterministic ? w : 0;
    facts.deterministic = opt.deterministic;
    facts.entropy = opt.entropy;
    if (opt.deterministic) {
      std::tie(facts.local_begin, facts.local_end) =
          tile_range(sh.vocab_shard_bounds()[sh.tp_rank()], w);
    } else {
      facts.local_begin = sh.local_vocab_start();
      facts.local_end = sh.local_vocab_end();
    }
    facts.rows = rows;
    facts.rows_layout = opt.rows_layout;
    facts.contract = &c;
    facts.targets = targets;
    facts.local_error = local_error;
    try {
      op::run_preflight(comm, facts);
    } catch (const ContractError& e) {
      // The preflight rethrows only this rank's message; keep the original error's code.
      if (local_exception && e.what() == *local_error) std::rethrow_exception(local_exception);
      throw;
    }
  }

  // 3. This rank's node partials and its copies of the targets it owns.
  const auto& active_mask = c.mask().active_mask();
  auto saved = std::make_shared<SavedForward>();
  saved->logits = logits;
  saved->producer = SavedForward::Producer::vocab_parallel;
  saved->kernels = &kernels_;
  saved->has_entropy = opt.entropy;
  saved->entropy_grad = opt.entropy && opt.entropy_grad;
  saved->exec = opt.exec;
  saved->active.resize(static_cast<std::size_t>(rows));
  saved->target_local.assign(static_cast<std::size_t>(rows), -1);
  std::vector<int64_t> owner(static_cast<std::size_t>(rows), -1);
  for (int64_t i = 0; i < rows; ++i) {
    saved->active[i] = active_mask[i] ? 1 : 0;
    const int64_t t = targets[i];
    if (!active_mask[i] || t < 0 || t >= sh.real_vocab_size()) continue;  // (validate off)
    owner[i] = sh.owner_rank(t);
    if (owner[i] == sh.tp_rank()) saved->target_local[i] = t - sh.local_vocab_start();
  }

  std::vector<TreeNode> local_nodes;
  std::vector<std::vector<TreeNode>> covers;
  std::size_t width = 1;  // partials per row on the wire
  if (opt.deterministic) {
    saved->spec = ShardSpec{.vocab_start = sh.local_vocab_start(),
                            .geometry = geometry,
                            .temperature = c.temperature()};
    covers = covers_of_all_ranks(c, geometry);
    local_nodes = covers[sh.tp_rank()];
    width = max_cover(covers);
  } else {
    saved->spec = local_spec(c);
    local_nodes = canonical_cover(saved->spec.geometry, 0, ceil_div(sh.local_vocab_size(), w));
  }
  std::vector<NodePartial> local(static_cast<std::size_t>(rows) * local_nodes.size());
  if (!local_nodes.empty()) {
    kernels_.node_partials(logits, saved->spec, local_nodes, opt.entropy, local, opt.exec);
  }
  std::vector<float> target_z(static_cast<std::size_t>(rows));
  kernels_.read_target_logits(logits, saved->spec, saved->target_local, target_z);

  // 4. This rank's block of the all-gather (op/forward_wire.hpp); one all-gather.
  const op::ForwardWire wire(rows, width, opt.entropy);
  std::vector<float> send(wire.block_floats());
  for (int64_t i = 0; i < rows; ++i) {
    const NodePartial* row = local.data() + i * local_nodes.size();
    if (opt.deterministic) {
      for (std::size_t j = 0; j < local_nodes.size(); ++j) wire.put_partial(send, i, j, row[j]);
      wire.pad_partials(send, i, local_nodes.size());
    } else {
      wire.put_partial(send, i, 0, fold(row, local_nodes.size(), opt.entropy));
    }
    wire.put_target(send, i, target_z[i]);
  }

  std::vector<float> recv;
  std::span<const float> gathered = send;
  if (tp > 1) {
    recv.resize(wire.block_floats() * static_cast<std::size_t>(tp));
    op::collective_step("forward all-gather of the node partials", [&] {
      all_gather(comm, std::span<const float>(send), std::span<float>(recv));
    });
    gathered = recv;
  }

  // 5. Roots. Deterministic: every rank's cover nodes in rank order, one merge by the tree.
  //    Non-deterministic: one partial per rank, folded in rank order.
  LogprobResult out;
  out.lse.resize(static_cast<std::size_t>(rows));
  if (opt.entropy) out.entropy.resize(static_cast<std::size_t>(rows));
  auto unpack = [&](int64_t rank, int64_t i, std::size_t j) {
    return wire.partial(wire.block_of(gathered, rank), i, j);
  };
  if (opt.deterministic) {
    std::vector<TreeNode> all_nodes;
    for (const auto& cov : covers) all_nodes.insert(all_nodes.end(), cov.begin(), cov.end());
    std::vector<NodePartial> all(static_cast<std::size_t>(rows) * all_nodes.size());
    for (int64_t i = 0; i < rows; ++i) {
      std::size_t k = 0;
      for (int64_t r = 0; r < tp; ++r) {
        for (std::size_t j = 0; j < covers[r].size(); ++j)
          all[i * all_nodes.size() + k++] = unpack(r, i, j);
      }
    }
    kernels_.merge_roots(geometry, all_nodes, all, rows,
                         RootsOut{.lse = out.lse, .entropy = out.entropy}, opt.exec);
  } else {
    for (int64_t i = 0; i < rows; ++i) {
      canon::Partial acc = canon::identity_partial();
      for (int64_t r = 0; r < tp; ++r) {
        acc = canon::merge(acc, unpack(r, i, 0), opt.entropy);
      }
      const canon::RootValues root = canon::finish_root(acc);
      out.lse[i] = root.lse;
      if (opt.entropy) out.entropy[i] = root.entropy;
    }
  }

  // 6. logp: the target logit is copied from its owner's block, never summed.
  out.logp.assign(static_cast<std::size_t>(rows), 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    if (!active_mask[i]) continue;
    if (owner[i] < 0) {  // out-of-range active target with validate=false
      out.logp[i] = canon::canonical_nan();
      continue;
    }
    out.logp[i] =
        canon::selected_logp(wire.target(wire.block_of(gathered, owner[i]), i), out.lse[i]);
  }

  // 7. Active rows must have a finite LSE (checked after compute, identically on every rank).
  if (opt.validate) {
    for (int64_t i = 0; i < rows; ++i) {
      if (active_mask[i] && !std::isfinite(out.lse[i])) {
        throw ContractError(
            ErrorCode::non_finite_result, "local_logits",
            fmt::format(
                "non-finite logsumexp on an active row (token {}: lse={}): logits over the real "
                "vocabulary must be finite for every active token",
                i, out.lse[i]));
      }
    }
  }
  saved->lse = out.lse;
  if (saved->entropy_grad) saved->entropy = out.entropy;  // backward's only use of it
  out.saved = std::move(saved);
  return out;
}

void VocabParallelLogprob::backward(const LogprobResult& fwd, const LogprobGrads& g,
                                    const MutableLogitsView& grad) const {
  if (!fwd.saved) {
    throw ContractError(ErrorCode::mode_mismatch, "fwd",
                        "backward needs the LogprobResult of a forward call (its saved state is "
                        "empty)");
  }
  const SavedForward& s = *fwd.saved;
  if (s.producer != SavedForward::Producer::vocab_parallel || s.kernels == nullptr) {
    throw ContractError(
        ErrorCode::mode_mismatch, "fwd",
        fmt::format(
            "{}: backward was given the result of another operator's forward; call backward on the "
            "operator that ran forward",
            backend_id_));
  }
  const int64_t rows = s.logits.rows;
  auto check_len = [&](std::span<const float> v, const char* name) {
    if (!v.empty() && static_cast<int64_t>(v.size()) != rows) {
      throw ContractError(ErrorCode::wrong_shape, name,
                          fmt::format("{} must have one entry per token: got {} for {} tokens",
                                      name, v.size(), rows));
    }
  };
  check_len(g.grad_logp, "grad_logp");
  check_len(g.grad_lse, "grad_lse");
  check_len(g.grad_entropy, "grad_entropy");
  if (!g.grad_entropy.empty() && !s.has_entropy) {
    throw ContractError(ErrorCode::mode_mismatch, "grad_entropy",
                        "grad_entropy was given but forward ran with entropy=false; run forward "
                        "with entropy=true");
  }
  if (!g.grad_entropy.empty() && !s.entropy_grad) {
    throw ContractError(
        ErrorCode::mode_mismatch, "grad_entropy",
        "grad_entropy was given but forward ran with entropy_grad=false (the entropy is a "
        "constant for backward); run forward with entropy_grad=true to differentiate it");
  }
  if (grad.rows != rows || grad.cols != s.logits.cols || grad.dtype != s.logits.dtype ||
      grad.row_stride < grad.cols || (rows > 0 && grad.data == nullptr)) {
    throw ContractError(ErrorCode::wrong_shape, "grad",
                        fmt::format("grad must have the logits' shape [{}, {}] and dtype {}; got "
                                    "[{}, {}] {} (row_stride {})",
                                    rows, s.logits.cols, dtype_name(s.logits.dtype), grad.rows,
                                    grad.cols, dtype_name(grad.dtype), grad.row_stride));
  }
  // Inactive rows get no logp gradient (but do get the LSE and entropy gradients).
  std::vector<float> g_logp;
  if (!g.grad_logp.empty()) {
    g_logp.assign(g.grad_logp.begin(), g.grad_logp.end());
    for (int64_t i = 0; i < rows; ++i) {
      if (!s.active[i]) g_logp[i] = 0.0f;
    }
  }
  // LSE and entropy from the saved copies: the result's public vectors may have been moved.
  BackwardInputs in{.lse = s.lse,
                    .entropy = s.entropy,
                    .target_local = s.target_local,
                    .grad_logp = g_logp,
                    .grad_lse = g.grad_lse,
                    .grad_entropy = g.grad_entropy};
  s.kernels->backward(s.logits, s.spec, in, grad, s.exec);
}

}  // namespace detlogp
