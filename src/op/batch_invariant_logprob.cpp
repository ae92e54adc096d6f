// BatchInvariantLogprob: the single-shard batch-invariant op. Per row: fp32 max, sum of
// exp(z - max) left to right, log; logp = z[target] - lse. Batch-invariant (each row's order
// depends only on the vocabulary width) but not the canon, and TP = 1 only.

#include <cmath>

#include <fmt/format.h>

#include "detlogp/operator.hpp"
#include "numerics/canon.hpp"
#include "numerics/element_io.hpp"
#include "op/call_checks.hpp"
#include "op/saved_forward.hpp"

namespace detlogp {

BatchInvariantLogprob::BatchInvariantLogprob(std::string backend_id)
    : backend_id_(std::move(backend_id)) {}

LogprobResult BatchInvariantLogprob::forward(const LogitsView& logits,
                                             std::span<const int64_t> targets,
                                             const LogprobContract& c, Communicator& comm,
                                             const ForwardOptions& opt) const {
  const ShardingSpec& sh = c.sharding();
  if (sh.tp_world_size() != 1 || comm.size() != 1) {
    throw ContractError(ErrorCode::not_supported, "tp_world_size",
                        fmt::format("{} is a single-shard backend: it needs tp_world_size=1 and a "
                                    "communicator of one rank; got tp_world_size={} and {} ranks",
                                    backend_id_, sh.tp_world_size(), comm.size()));
  }
  if (opt.entropy) {
    throw ContractError(ErrorCode::not_supported, "entropy",
                        fmt::format("{} does not compute the entropy; request a vocab-parallel "
                                    "backend for entropy=true",
                                    backend_id_));
  }
  if (c.softcap()) {
    throw ContractError(ErrorCode::not_supported, "softcap",
                        fmt::format("{} has no logit softcap (softcap={}); request a "
                                    "vocab-parallel backend for a softcap",
                                    backend_id_, *c.softcap()));
  }
  if (!opt.row_temperature.empty()) {
    throw ContractError(ErrorCode::not_supported, "temperature",
                        fmt::format("{} has no per-row temperature; pass one temperature in the "
                                    "contract, or request a vocab-parallel backend",
                                    backend_id_));
  }
  if (opt.kept.given()) {
    throw ContractError(ErrorCode::not_supported, "kept_ids",
                        fmt::format("{} has no kept sets (its capability: supports_kept_sets "
                                    "false); request a vocab-parallel backend for kept_ids",
                                    backend_id_));
  }
  if (logits.rows < 0 || logits.cols < 0 || (logits.rows > 0 && logits.data == nullptr) ||
      logits.row_stride < logits.cols) {
    throw ContractError(
        ErrorCode::wrong_shape, "local_logits",
        fmt::format(
            "local_logits must be 2-D [num_tokens, vocab] with data and row_stride >= cols; got "
            "rows={} cols={} row_stride={}",
            logits.rows, logits.cols, logits.row_stride));
  }
  if (logits.dtype != c.dtype()) {
    throw ContractError(ErrorCode::wrong_dtype, "local_logits",
                        fmt::format("local_logits dtype {} does not match the contract dtype {}",
                                    to_string(logits.dtype), to_string(c.dtype())));
  }
  if (logits.cols != sh.padded_vocab_size() || logits.rows != c.mask().num_tokens() ||
      static_cast<int64_t>(targets.size()) != logits.rows || logits.row_stride < logits.cols) {
    throw ContractError(ErrorCode::wrong_shape, "local_logits",
                        fmt::format("local_logits [{}, {}] with {} targets does not match the "
                                    "contract's [{}, {}] (one target per token)",
                                    logits.rows, logits.cols, targets.size(), c.mask().num_tokens(),
                                    sh.padded_vocab_size()));
  }
  const int64_t real = sh.real_vocab_size();
  const auto& active = c.mask().active_mask();
  auto saved = std::make_shared<SavedForward>();
  saved->logits = logits;
  saved->producer = SavedForward::Producer::batch_invariant;
  saved->spec = ShardSpec{.vocab_start = 0,
                          .geometry = {.real_vocab = real, .tile_width = 1},
                          .temperature = c.temperature()};
  saved->active.resize(static_cast<std::size_t>(logits.rows));
  saved->target_local.assign(static_cast<std::size_t>(logits.rows), -1);
  LogprobResult out;
  out.logp.assign(static_cast<std::size_t>(logits.rows), 0.0f);
  out.lse.resize(static_cast<std::size_t>(logits.rows));
  for (int64_t i = 0; i < logits.rows; ++i) {
    const int64_t base = i * logits.row_stride;
    auto z = [&](int64_t col) {
      return canon::scale_logit(numerics::load_as_float(logits.data, logits.dtype, base + col),
                                c.temperature());
    };
    float mx = -INFINITY;
    for (int64_t col = 0; col < real; ++col) mx = std::fmax(mx, z(col));
    float s = 0.0f;
    if (std::isfinite(mx)) {
      for (int64_t col = 0; col < real; ++col) s += std::exp(z(col) - mx);
    }
    out.lse[i] = std::isfinite(mx) ? mx + std::log(s) : mx;
    saved->active[i] = active[i] ? 1 : 0;
    if (!active[i]) continue;
    const int64_t t = targets[i];
    if (opt.validate && (t < 0 || t >= real)) {
      throw ContractError(
          ErrorCode::token_out_of_vocab, "target_ids",
          fmt::format(
              "active target_ids must lie in the real vocabulary [0, {}); got {} at token {}", real,
              t, i));
    }
    if (t < 0 || t >= real) {
      out.logp[i] = canon::canonical_nan();
      continue;
    }
    saved->target_local[i] = t;
    out.logp[i] = z(t) - out.lse[i];
    if (opt.validate && !std::isfinite(out.lse[i])) {
      throw ContractError(
          ErrorCode::non_finite_result, "local_logits",
          fmt::format("non-finite logsumexp on an active row (token {}): logits "
                      "over the real vocabulary must be finite for every active token",
                      i));
    }
  }
  saved->lse = out.lse;
  out.saved = std::move(saved);
  return out;
}

void BatchInvariantLogprob::backward(const LogprobResult& fwd, const LogprobGrads& g,
                                     const MutableLogitsView& grad) const {
  const SavedForward& s =
      op::saved_state_of(fwd, SavedForward::Producer::batch_invariant, backend_id_);
  const LogitsView& x = s.logits;
  if (!g.grad_entropy.empty()) {
    throw ContractError(ErrorCode::not_supported, "grad_entropy",
                        fmt::format("{} has no entropy gradient", backend_id_));
  }
  op::check_logits_grad(grad, x);
  op::check_grads(g, x.rows, /*has_entropy=*/false);
  const int64_t real = s.spec.geometry.real_vocab;
  const float tau = s.spec.temperature;
  for (int64_t i = 0; i < x.rows; ++i) {
    const float lse = s.lse[i];
    const float gl = g.grad_logp.empty() || !s.active[i] ? 0.0f : g.grad_logp[i];
    const float gz = g.grad_lse.empty() ? 0.0f : g.grad_lse[i];
    for (int64_t col = 0; col < x.cols; ++col) {
      float v = 0.0f;
      if (col < real && std::isfinite(lse)) {
        const float z = canon::scale_logit(
            numerics::load_as_float(x.data, x.dtype, i * x.row_stride + col), tau);
        const float p = std::exp(z - lse);
        v = gl * ((col == s.target_local[i] ? 1.0f : 0.0f) - p) + gz * p;
        if (tau != 1.0f) v = v / tau;
      }
      numerics::store_from_float(grad.data, grad.dtype, i * grad.row_stride + col, v);
    }
  }
}

}  // namespace detlogp
