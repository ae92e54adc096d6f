#include "scoring.hpp"

#include <chrono>
#include <cstring>
#include <mutex>

#include "cli.hpp"

namespace detlogp::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
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
                            .exec = {.threads = threads}};
  auto phase = [&](const char* name) {
    if (comm.rank() == 0 && request.on_phase) request.on_phase(name);
  };
  phase("forward");
  comm.barrier();
  auto t0 = std::chrono::steady_clock::now();
  out.result = d.op->forward(shard, request.targets, contract, comm, fopt);
  comm.barrier();
  out.forward_seconds = seconds_since(t0);
  if (wants_backward(request.grads)) {
    phase("backward");
    t0 = std::chrono::steady_clock::now();
    d.op->backward(out.result, request.grads, grad_shard);
    comm.barrier();
    out.backward_seconds = seconds_since(t0);
  }
  return out;
}

LogitsView columns(const LogitsView& full, int64_t start, int64_t end) {
  LogitsView v = full;
  v.data = static_cast<const std::byte*>(full.data) +
           start * static_cast<int64_t>(dtype_size(full.dtype));
  v.cols = end - start;
  return v;
}

MutableLogitsView columns(const MutableLogitsView& full, int64_t start, int64_t end) {
  MutableLogitsView v = full;
  if (full.data != nullptr) {
    v.data =
        static_cast<std::byte*>(full.data) + start * static_cast<int64_t>(dtype_size(full.dtype));
  }
  v.cols = end - start;
  return v;
}

std::vector<RankScore> score_in_process(const ScoreRequest& request, const LogitsView& logits,
                                        const MutableLogitsView& grad, int threads) {
  const int tp = static_cast<int>(request.bounds.size());
  std::vector<RankScore> ranks(static_cast<std::size_t>(tp));
  run_ranks(
      tp,
      [&](Communicator& comm) {
        const int r = comm.rank();
        const VocabRange b = request.bounds[static_cast<std::size_t>(r)];
        ranks[static_cast<std::size_t>(r)] =
            score_rank(comm, request, columns(logits, b.start, b.end),
                       columns(grad, b.start, b.end), rank_threads(threads, tp, r));
      },
      InProcessOptions{.collective_timeout = request.collective_timeout});
  return ranks;
}

bool outputs_replicated(const std::vector<RankScore>& ranks) {
  for (const RankScore& s : ranks) {
    if (!same_bits(s.result.logp, ranks[0].result.logp) ||
        !same_bits(s.result.lse, ranks[0].result.lse) ||
        !same_bits(s.result.entropy, ranks[0].result.entropy)) {
      return false;
    }
  }
  return true;
}

}  // namespace detlogp::cli
