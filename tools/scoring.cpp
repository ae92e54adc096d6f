#include "scoring.hpp"

#include <chrono>
#include <cstring>
#include <type_traits>

#include "cli.hpp"

namespace detlogp::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Forward, then backward when the request asks, each timed between barriers of `comm` (TP
// rank 0 announces each phase).
template <class Forward, class Backward>
void timed_phases(Communicator& comm, const ScoreRequest& request, double& forward_seconds,
                  double& backward_seconds, Forward&& forward, Backward&& backward) {
  auto phase = [&](const char* name) {
    if (comm.rank() == 0 && request.on_phase) request.on_phase(name);
  };
  phase("forward");
  comm.barrier();
  auto t0 = std::chrono::steady_clock::now();
  forward();
  comm.barrier();
  forward_seconds = seconds_since(t0);
  if (wants_backward(request.grads)) {
    phase("backward");
    t0 = std::chrono::steady_clock::now();
    backward();
    comm.barrier();
    backward_seconds = seconds_since(t0);
  }
}

// Rows [row0, row1) x columns [col0, col1) of a matrix view (a null view stays null).
const void* advance(const void* p, int64_t bytes) {
  return static_cast<const std::byte*>(p) + bytes;
}
void* advance(void* p, int64_t bytes) { return static_cast<std::byte*>(p) + bytes; }

template <class View>
View sub_view(const View& full, int64_t row0, int64_t row1, int64_t col0, int64_t col1) {
  View v = full;
  if (full.data != nullptr) {
    v.data = advance(
        full.data, (row0 * full.row_stride + col0) * static_cast<int64_t>(dtype_size(full.dtype)));
  }
  v.rows = row1 - row0;
  v.cols = col1 - col0;
  return v;
}

// Every rank of the request's TP group on an in-process group, each scored by
// score(comm, its shard's bounds, its share of `threads`). Returns the scores by TP rank.
template <class Score, class ScoreFn>
std::vector<Score> on_in_process_group(const ScoreRequest& request, int threads, ScoreFn&& score) {
  const int tp = static_cast<int>(request.bounds.size());
  std::vector<Score> ranks(static_cast<std::size_t>(tp));
  run_ranks(
      tp,
      [&](Communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        ranks[r] = score(comm, request.bounds[r], rank_threads(threads, tp, comm.rank()));
      },
      InProcessOptions{.collective_timeout = request.collective_timeout});
  return ranks;
}

template <class Score>
bool replicated(const std::vector<Score>& ranks) {
  for (const Score& s : ranks) {
    if (!same_bits(s.result.logp, ranks[0].result.logp) ||
        !same_bits(s.result.lse, ranks[0].result.lse) ||
        !same_bits(s.result.entropy, ranks[0].result.entropy)) {
      return false;
    }
  }
  return true;
}

}  // namespace

LogprobContract make_contract(const ScoreRequest& r, int64_t tp_rank) {
  MaskSpec mask({.num_tokens = static_cast<int64_t>(r.targets.size()),
                 .active_mask = *r.active,
                 .ignore_index = -100});
  ShardingSpec sharding({.tp_rank = tp_rank,
                         .tp_world_size = static_cast<int64_t>(r.bounds.size()),
                         .vocab_shard_bounds = r.bounds,
                         .real_vocab_size = r.real_vocab,
                         .padded_vocab_size = r.padded_vocab,
                         .cp_rank = r.cp_rank,
                         .cp_world_size = r.cp_size});
  ReductionSpec reduction({.determinism_scope = r.deterministic
                                                    ? DeterminismScope::cross_tp_bitwise
                                                    : DeterminismScope::fixed_topology});
  return LogprobContract({.role = Role::train,
                          .dtype = r.dtype,
                          .mask = mask,
                          .sharding = sharding,
                          .reduction = reduction,
                          .temperature = r.temperature,
                          .softcap = r.softcap,
                          .tile_width = r.tile_width});
}

bool wants_backward(const LogprobGrads& g) {
  return !g.grad_logp.empty() || !g.grad_lse.empty() || !g.grad_entropy.empty();
}

RankScore score_rank(Communicator& comm, const ScoreRequest& request, const LogitsView& shard,
                     const MutableLogitsView& grad_shard, int threads) {
  const LogprobContract contract = make_contract(request, comm.rank());
  DispatchResult d = Registry::global().get_logprob_op(contract, request.backend, request.platform);
  RankScore out;
  out.provenance_json = d.provenance_json;
  out.actual_backend = d.actual_backend;
  out.kernel = d.op->kernel_name();
  out.contract_fingerprint = contract.cross_rank_fingerprint();
  const ForwardOptions fopt{.deterministic = request.deterministic,
                            .validate = true,
                            .entropy = request.entropy,
                            .exec = {.threads = threads},
                            .row_temperature = request.row_temperature,
                            .kept = request.kept};
  timed_phases(
      comm, request, out.forward_seconds, out.backward_seconds,
      [&] { out.result = d.op->forward(shard, request.targets, contract, comm, fopt); },
      [&] { d.op->backward(out.result, request.grads, grad_shard); });
  return out;
}

LogitsView columns(const LogitsView& full, int64_t start, int64_t end) {
  return sub_view(full, 0, full.rows, start, end);
}

MutableLogitsView columns(const MutableLogitsView& full, int64_t start, int64_t end) {
  return sub_view(full, 0, full.rows, start, end);
}

std::vector<RankScore> score_in_process(const ScoreRequest& request, const LogitsView& logits,
                                        const MutableLogitsView& grad, int threads) {
  return on_in_process_group<RankScore>(
      request, threads, [&](Communicator& comm, VocabRange b, int rank_threads) {
        return score_rank(comm, request, columns(logits, b.start, b.end),
                          columns(grad, b.start, b.end), rank_threads);
      });
}

bool outputs_replicated(const std::vector<RankScore>& ranks) { return replicated(ranks); }
bool outputs_replicated(const std::vector<FusedRankScore>& ranks) { return replicated(ranks); }

FusedRankScore score_fused_rank(Communicator& comm, const ScoreRequest& request,
                                const LogitsView& hidden, const LogitsView& weight_shard,
                                const MutableLogitsView& grad_hidden,
                                const MutableLogitsView& grad_weight_shard, int threads) {
  const LogprobContract contract = make_contract(request, comm.rank());
  const FusedDispatchResult d = get_fused_linear_logprob_op(contract);
  FusedRankScore out;
  out.provenance_json = d.provenance_json;
  out.kernel = d.op->kernel_name();
  const FusedOptions fopt{.entropy = request.entropy,
                          .exec = {.threads = threads},
                          .row_temperature = request.row_temperature};
  timed_phases(
      comm, request, out.forward_seconds, out.backward_seconds,
      [&] {
        out.result = d.op->forward(hidden, weight_shard, request.targets, contract, comm, fopt);
      },
      [&] { d.op->backward(out.result, request.grads, grad_hidden, grad_weight_shard, comm); });
  return out;
}

std::vector<FusedRankScore> score_fused_in_process(const ScoreRequest& request,
                                                   const LogitsView& hidden,
                                                   const LogitsView& weight,
                                                   std::span<const MutableLogitsView> grad_hidden,
                                                   const MutableLogitsView& grad_weight,
                                                   int threads) {
  return on_in_process_group<FusedRankScore>(
      request, threads, [&](Communicator& comm, VocabRange b, int rank_threads) {
        return score_fused_rank(
            comm, request, hidden, sub_view(weight, b.start, b.end, 0, weight.cols),
            grad_hidden[static_cast<std::size_t>(comm.rank())],
            sub_view(grad_weight, b.start, b.end, 0, grad_weight.cols), rank_threads);
      });
}

}  // namespace detlogp::cli
