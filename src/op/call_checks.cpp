#include "op/call_checks.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace detlogp::op {

void check_matrix(const LogitsView& m, std::string_view field, std::string_view prefix) {
  if (m.rows < 0 || m.cols < 0 || (m.rows > 0 && m.cols > 0 && m.data == nullptr) ||
      m.row_stride < m.cols) {
    throw ContractError(ErrorCode::wrong_shape, field,
                        fmt::format("{}{} must be a 2-D row-major matrix with data and row_stride "
                                    ">= cols; got rows={} cols={} row_stride={}",
                                    prefix, field, m.rows, m.cols, m.row_stride));
  }
}

void check_local_vocab(int64_t cols, std::string_view field, std::string_view what,
                       const LogprobContract& c) {
  const ShardingSpec& sh = c.sharding();
  if (cols != sh.local_vocab_size()) {
    throw ContractError(
        ErrorCode::wrong_shape, field,
        fmt::format("{} has {} {} but the contract declares local shard [{}, {}) of size {}", field,
                    cols, what, sh.local_vocab_start(), sh.local_vocab_end(),
                    sh.local_vocab_size()));
  }
}

void check_num_tokens(int64_t rows, std::string_view field, const LogprobContract& c) {
  if (rows != c.mask().num_tokens()) {
    throw ContractError(
        ErrorCode::wrong_shape, field,
        fmt::format("{} has {} rows but the contract's MaskSpec declares num_tokens={}", field,
                    rows, c.mask().num_tokens()));
  }
}

void check_one_target_per_row(std::span<const int64_t> targets, int64_t rows,
                              std::string_view rows_of) {
  if (static_cast<int64_t>(targets.size()) != rows) {
    throw ContractError(
        ErrorCode::wrong_shape, "target_ids",
        fmt::format(
            "target_ids must be 1-D with one entry per token: got {} targets for {} {} rows",
            targets.size(), rows, rows_of));
  }
}

void check_row_temperature(std::span<const float> row_temperature, int64_t rows,
                           const LogprobContract& c) {
  if (row_temperature.empty()) return;
  if (static_cast<int64_t>(row_temperature.size()) != rows) {
    throw ContractError(ErrorCode::wrong_shape, "temperature",
                        fmt::format("per-row temperature has {} entries but there are {} rows; "
                                    "pass one temperature per row, or none",
                                    row_temperature.size(), rows));
  }
  if (c.temperature() != 1.0f) {
    throw ContractError(
        ErrorCode::conflicting_fields, "temperature",
        fmt::format("per-row temperatures were given with a contract temperature of {}; the "
                    "contract's temperature must be 1 when each row has its own (fold it into "
                    "the rows' values)",
                    c.temperature()));
  }
  for (std::size_t r = 0; r < row_temperature.size(); ++r) {
    const float t = row_temperature[r];
    if (!std::isfinite(t) || !(t > 0.0f)) {
      throw ContractError(ErrorCode::out_of_range, "temperature",
                          fmt::format("temperature of row {} is {}; every row's temperature must "
                                      "be a finite number > 0",
                                      r, t));
    }
  }
}

void check_dtype(DType dtype, std::string_view field, const LogprobContract& c) {
  if (dtype != c.dtype()) {
    throw ContractError(ErrorCode::wrong_dtype, field,
                        fmt::format("{} dtype {} does not match the contract dtype {}", field,
                                    to_string(dtype), to_string(c.dtype())));
  }
}

void check_transport_and_targets(const Communicator& comm, std::span<const int64_t> targets,
                                 const LogprobContract& c, bool validate) {
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
  if (!validate) return;
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

const SavedForward& saved_state_of(const LogprobResult& fwd, SavedForward::Producer producer,
                                   std::string_view backend_id) {
  if (!fwd.saved) {
    throw ContractError(ErrorCode::mode_mismatch, "fwd",
                        "backward needs the LogprobResult of a forward call (its saved state is "
                        "empty)");
  }
  if (fwd.saved->producer != producer) {
    throw ContractError(
        ErrorCode::mode_mismatch, "fwd",
        fmt::format(
            "{}: backward was given the result of another operator's forward; call backward on the "
            "operator that ran forward",
            backend_id));
  }
  return *fwd.saved;
}

void check_logits_grad(const MutableLogitsView& grad, const LogitsView& logits) {
  if (grad.rows != logits.rows || grad.cols != logits.cols || grad.dtype != logits.dtype ||
      grad.row_stride < grad.cols || (grad.rows > 0 && grad.cols > 0 && grad.data == nullptr)) {
    throw ContractError(ErrorCode::wrong_shape, "grad",
                        fmt::format("grad must have the logits' shape [{}, {}] and dtype {}; got "
                                    "[{}, {}] {} (row_stride {})",
                                    logits.rows, logits.cols, to_string(logits.dtype), grad.rows,
                                    grad.cols, to_string(grad.dtype), grad.row_stride));
  }
}

void check_grads(const LogprobGrads& g, int64_t rows, bool has_entropy) {
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
  if (!g.grad_entropy.empty() && !has_entropy) {
    throw ContractError(ErrorCode::mode_mismatch, "grad_entropy",
                        "grad_entropy was given but forward ran with entropy=false; run forward "
                        "with entropy=true");
  }
}

std::vector<float> active_grad_logp(std::span<const float> grad_logp,
                                    std::span<const uint8_t> active) {
  std::vector<float> g(grad_logp.begin(), grad_logp.end());
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (!active[i]) g[i] = 0.0f;
  }
  return g;
}

void check_finite_lse(const std::vector<bool>& active, std::span<const float> lse,
                      std::string_view field) {
  for (std::size_t i = 0; i < lse.size(); ++i) {
    if (active[i] && !std::isfinite(lse[i])) {
      throw ContractError(
          ErrorCode::non_finite_result, field,
          fmt::format(
              "non-finite logsumexp on an active row (token {}: lse={}): logits over the real "
              "vocabulary must be finite for every active token",
              i, lse[i]));
    }
  }
}

}  // namespace detlogp::op
