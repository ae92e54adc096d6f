// `detlogp rollout`: the rollout side and the trainer at different layouts, on a keyed
// synthetic batch. For each pairing, every row is sampled by detlogp::sample at vLLM's layout
// (the real vocabulary padded to a multiple of 64, split evenly over the rollout's TP ranks:
// shard bounds off the 128-column tile) on an in-process group, then the sampled tokens are
// scored by the logits operator at Megatron's layout (padded to a multiple of 128 x TP) on
// another group, and the tokens whose logprobs differ in any bit are counted (the check: 0).
// Twice per pairing: every row at temperature 1 over the full vocabulary, then per-row sampling
// parameters (temperature with greedy rows, top-k, top-p; restricted and unrestricted rows mixed),
// the trainer taking the rollout's kept sets once as given ids and once recomputed from top_k /
// top_p. For comparison the same tokens are scored with plain fp32 arithmetic on both sides: a
// log-softmax of each gathered row (max, then the sum of exp in column order) against
// Megatron's vocab-parallel one (the max all-reduced, each rank's sum in column order, the sums
// added in rank order).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "detlogp/detlogp.hpp"
#include "detlogp/dtype.hpp"
#include "detlogp/sampler.hpp"
#include "digest.hpp"
#include "run_checks.hpp"
#include "scoring.hpp"
#include "synthetic.hpp"
#include "table.hpp"

namespace detlogp::cli {
namespace {

struct Pairing {
  int64_t rollout_tp = 0;
  int64_t train_tp = 0;
};

// "3:1,4:2" -> {{3, 1}, {4, 2}}.
std::vector<Pairing> parse_pairings(const std::string& text) {
  std::vector<Pairing> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const std::size_t colon = item.find(':');
    if (colon == std::string::npos) {
      throw UsageError(fmt::format(
          "--pairs takes ROLLOUT_TP:TRAIN_TP pairs, comma-separated (e.g. 3:1,4:2); got '{}'",
          text));
    }
    const auto rollout = parse_int_list(item.substr(0, colon), "--pairs");
    const auto train = parse_int_list(item.substr(colon + 1), "--pairs");
    if (rollout.size() != 1 || train.size() != 1) {
      throw UsageError(fmt::format("--pairs: '{}' is not ROLLOUT_TP:TRAIN_TP", item));
    }
    check_in_process_tp(rollout[0], "--pairs");
    check_in_process_tp(train[0], "--pairs");
    out.push_back({rollout[0], train[0]});
    at = comma + 1;
  }
  return out;
}

// vLLM's layout: the real vocabulary padded to a multiple of 64, split evenly.
VocabLayout vllm_layout(int64_t real, int64_t tp) {
  const int64_t padded = (real + 63) / 64 * 64;
  return {padded, even_bounds(padded, tp)};
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Each row's request: its seed and position, and the sampling parameters of the configuration
// ("full": temperature 1, no restriction; "per-row": keyed choices).
struct Requests {
  std::vector<int64_t> seeds, positions;
  std::vector<float> temperature;  // the sampler's (0: greedy)
  std::vector<float> scoring;      // the trainer's (greedy rows score at 1)
  std::vector<int32_t> top_k;
  std::vector<float> top_p;
  std::vector<bool> restricted;
};

Requests make_requests(uint64_t key, int64_t rows, bool per_row) {
  static constexpr float kTemperatures[] = {0.0f, 0.6f, 1.0f, 1.4f};
  // top_p only with a top_k: over a large synthetic vocabulary a top-p set alone can need more
  // than kMaxKeptIds ids (a ContractError by the kept sets' rule).
  static constexpr int32_t kTopK[] = {0, 20, 50, 200};
  static constexpr float kTopP[] = {1.0f, 1.0f, 0.9f, 0.75f};
  Requests q;
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t h = mix(key ^ mix(static_cast<uint64_t>(r)));
    q.seeds.push_back(static_cast<int64_t>(mix(h) >> 1));
    q.positions.push_back(r % kMaxSequenceLength);
    const float t = per_row ? kTemperatures[h & 3] : 1.0f;
    const int32_t k = per_row ? kTopK[(h >> 2) & 3] : 0;
    const float p = per_row && k > 0 ? kTopP[(h >> 4) & 3] : 1.0f;
    q.temperature.push_back(t);
    q.scoring.push_back(t == 0.0f ? 1.0f : t);
    q.top_k.push_back(k);
    q.top_p.push_back(p);
    q.restricted.push_back(k > 0 || p < 1.0f);
  }
  return q;
}

struct Batch {
  SyntheticSpec spec;
  std::vector<std::byte> logits;  // [rows, stride]
  int64_t stride = 0;
  int threads = 1;
  std::chrono::milliseconds timeout{};
  LogitsView view(int64_t padded) const {
    return {logits.data(), spec.dtype, spec.tokens, padded, stride};
  }
};

// Every row sampled at `layout` on an in-process group; rank 0's result (replicated checked).
SampleResult rollout(const Batch& b, const VocabLayout& layout, const Requests& q,
                     bool* replicated) {
  const int tp = static_cast<int>(layout.vocab_shard_bounds.size());
  const std::vector<bool> active(static_cast<std::size_t>(b.spec.tokens), true);
  const std::vector<int64_t> no_targets(static_cast<std::size_t>(b.spec.tokens), 0);
  ScoreRequest req{.dtype = b.spec.dtype,
                   .real_vocab = b.spec.real_vocab,
                   .padded_vocab = layout.padded_vocab_size,
                   .bounds = layout.vocab_shard_bounds,
                   .targets = no_targets,
                   .active = &active};
  std::vector<SampleResult> ranks(static_cast<std::size_t>(tp));
  const SampleOptions base{.seeds = q.seeds,
                           .positions = q.positions,
                           .temperature = q.temperature,
                           .top_k = q.top_k,
                           .top_p = q.top_p};
  run_ranks(
      tp,
      [&](Communicator& comm) {
        const LogprobContract contract = make_contract(req, comm.rank());
        DispatchResult d = Registry::global().get_logprob_op(contract, "auto", "cpu");
        const VocabRange s = layout.vocab_shard_bounds[static_cast<std::size_t>(comm.rank())];
        SampleOptions opt = base;
        opt.exec.threads = rank_threads(b.threads, tp, comm.rank());
        ranks[static_cast<std::size_t>(comm.rank())] = sample(
            *d.op, columns(b.view(layout.padded_vocab_size), s.start, s.end), contract, comm, opt);
      },
      InProcessOptions{.collective_timeout = b.timeout});
  *replicated = true;
  for (const SampleResult& r : ranks) {
    *replicated = *replicated && r.tokens == ranks[0].tokens && same_bits(r.logp, ranks[0].logp) &&
                  same_bits(r.full_logp, ranks[0].full_logp) && r.kept_ids == ranks[0].kept_ids;
  }
  return std::move(ranks[0]);
}

// The trainer's logp of `tokens` at `layout` for the rows in `active` (others +0), with the
// given kept sets (none: the full vocabulary).
std::vector<float> train_logp(const Batch& b, const VocabLayout& layout, const Requests& q,
                              std::span<const int64_t> tokens, const std::vector<bool>& active,
                              const KeptSetOptions& kept) {
  ScoreRequest req{.dtype = b.spec.dtype,
                   .real_vocab = b.spec.real_vocab,
                   .padded_vocab = layout.padded_vocab_size,
                   .bounds = layout.vocab_shard_bounds,
                   .row_temperature = q.scoring,
                   .kept = kept,
                   .targets = tokens,
                   .active = &active,
                   .collective_timeout = b.timeout};
  return score_in_process(req, b.view(layout.padded_vocab_size), MutableLogitsView{}, b.threads)[0]
      .result.logp;
}

// Row `row`'s scores z = logit / temperature over the real vocabulary, as stored.
std::vector<float> scores(const Batch& b, int64_t row, float temperature) {
  std::vector<float> z(static_cast<std::size_t>(b.spec.real_vocab));
  const std::size_t size = dtype_size(b.spec.dtype);
  const auto* p = b.logits.data() + static_cast<std::size_t>(row * b.stride) * size;
  for (std::size_t c = 0; c < z.size(); ++c) {
    float x;
    if (b.spec.dtype == DType::fp32) {
      std::memcpy(&x, p + c * size, sizeof(float));
    } else {
      std::uint16_t h;
      std::memcpy(&h, p + c * size, sizeof(h));
      x = widen_half(b.spec.dtype, h);
    }
    z[c] = x / temperature;
  }
  return z;
}

// Plain fp32 arithmetic: the log-softmax of `target` over the ids marked in `in`: the max over
// them (m), then one sum of exp(z - m) per shard of `bounds` in column order, the shards' sums
// added in order (one shard: the rollout's gathered row).
float plain_logp(std::span<const float> z, const std::vector<bool>& in, float m, int64_t target,
                 const std::vector<VocabRange>& bounds) {
  const auto real = static_cast<int64_t>(z.size());
  float total = 0.0f;
  for (const VocabRange& s : bounds) {
    float part = 0.0f;
    for (int64_t c = s.start; c < std::min(s.end, real); ++c) {
      const auto i = static_cast<std::size_t>(c);
      if (in[i]) part += std::exp(z[i] - m);
    }
    total += part;
  }
  return (z[static_cast<std::size_t>(target)] - m) - std::log(total);
}

// Whether the plain arithmetic of row r differs between the rollout (one gathered row) and the
// trainer (Megatron's shards).
bool plain_differs(const Batch& b, int64_t row, float temperature, int64_t target,
                   std::span<const int64_t> kept, const VocabLayout& train) {
  const std::vector<float> z = scores(b, row, temperature);
  std::vector<bool> in(z.size(), kept.empty());
  for (int64_t id : kept) {
    if (id >= 0) in[static_cast<std::size_t>(id)] = true;
  }
  float m = -INFINITY;
  for (std::size_t c = 0; c < z.size(); ++c) {
    if (in[c]) m = std::max(m, z[c]);
  }
  const std::vector<VocabRange> gathered = {{0, static_cast<int64_t>(z.size())}};
  const float rollout_side = plain_logp(z, in, m, target, gathered);
  const float train_side = plain_logp(z, in, m, target, train.vocab_shard_bounds);
  return std::memcmp(&rollout_side, &train_side, sizeof(float)) != 0;
}

bool differ(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) != 0; }

struct PairingRun {
  Pairing pairing;
  std::string sampling;
  int64_t tokens = 0, restricted = 0, greedy = 0;
  // Tokens whose trainer logp (the full call on unrestricted rows, the kept sets given and
  // recomputed on restricted ones) or full-vocabulary logp differs from the sampler's.
  int64_t differ = 0;
  int64_t plain_differ = 0;   // plain fp32 arithmetic, rollout row vs Megatron's shards
  bool replicated = true;     // every rollout rank returned the same tokens and logprobs
  std::string tokens_sha256;  // of the sampled tokens: the same at every rollout layout
};

PairingRun run_pairing(const Batch& b, Pairing p, bool per_row) {
  PairingRun out;
  out.pairing = p;
  out.sampling = per_row ? "per-row" : "full";
  const Requests q = make_requests(b.spec.key, b.spec.tokens, per_row);
  const VocabLayout roll = vllm_layout(b.spec.real_vocab, p.rollout_tp);
  const VocabLayout train = megatron_bounds(b.spec.real_vocab, p.train_tp);
  const SampleResult s = rollout(b, roll, q, &out.replicated);
  out.tokens_sha256 = sha256_hex_of(s.tokens);
  const auto rows = static_cast<std::size_t>(b.spec.tokens);
  out.tokens = b.spec.tokens;
  out.restricted = std::count(q.restricted.begin(), q.restricted.end(), true);
  out.greedy = std::count(q.temperature.begin(), q.temperature.end(), 0.0f);
  // Every row's full-vocabulary logp (the logp of the unrestricted rows): the full call.
  const std::vector<bool> all(rows, true);
  const std::vector<float> full = train_logp(b, train, q, s.tokens, all, {});
  std::vector<float> given(rows), recomputed(rows);
  if (out.restricted > 0) {
    // Restricted rows (unrestricted ones masked; top_k 1 there when recomputed, since every
    // row of a recomputed call is restricted): the rollout's kept sets given, then recomputed.
    std::vector<int32_t> k = q.top_k;
    for (std::size_t r = 0; r < rows; ++r) {
      if (!q.restricted[r]) k[r] = 1;
    }
    given =
        train_logp(b, train, q, s.tokens, q.restricted, {.ids = s.kept_ids, .width = s.kept_width});
    recomputed = train_logp(b, train, q, s.tokens, q.restricted, {.top_k = k, .top_p = q.top_p});
  }
  for (std::size_t r = 0; r < rows; ++r) {
    const bool bad =
        differ(full[r], s.full_logp[r]) ||
        (q.restricted[r] ? differ(given[r], s.logp[r]) || differ(recomputed[r], s.logp[r])
                         : differ(full[r], s.logp[r]));
    out.differ += bad ? 1 : 0;
    std::span<const int64_t> kept;
    if (q.restricted[r]) {
      kept = std::span<const int64_t>(s.kept_ids)
                 .subspan(r * static_cast<std::size_t>(s.kept_width),
                          static_cast<std::size_t>(s.kept_width));
    }
    out.plain_differ +=
        plain_differs(b, static_cast<int64_t>(r), q.scoring[r], s.tokens[r], kept, train) ? 1 : 0;
  }
  return out;
}

}  // namespace

int rollout_command(const RolloutOptions& o) {
  if (o.rows < 1) throw UsageError(fmt::format("--rows must be >= 1; got {}", o.rows));
  if (o.real_vocab < 2) {
    throw UsageError(fmt::format("--real-vocab must be >= 2; got {}", o.real_vocab));
  }
  const std::vector<Pairing> pairings = parse_pairings(o.pairs);
  Batch b;
  b.spec = {.tokens = o.rows,
            .real_vocab = o.real_vocab,
            .dtype = parse_dtype(o.dtype, "--dtype"),
            .key = o.batch_key};
  b.threads = resolve_threads(o.threads);
  b.timeout = parse_collective_timeout(o.collective_timeout);
  for (const Pairing& p : pairings) {
    b.stride = std::max({b.stride, vllm_layout(o.real_vocab, p.rollout_tp).padded_vocab_size,
                         megatron_bounds(o.real_vocab, p.train_tp).padded_vocab_size});
  }
  // The logits: refused up front when they cannot fit, rather than a std::bad_alloc.
  const RunBuffer buffers[] = {{.name = "the logits",
                                .rows = static_cast<std::uint64_t>(o.rows),
                                .cols = static_cast<std::uint64_t>(b.stride),
                                .element_size = dtype_size(b.spec.dtype)}};
  const std::uint64_t bytes = require_run_memory(
      buffers, fmt::format("--rows {} x {} columns of {}", o.rows, b.stride, o.dtype),
      "use fewer --rows");
  b.logits.resize(static_cast<std::size_t>(bytes));
  fill_logits(b.spec, 0, o.rows, 0, b.stride, b.logits.data(), b.stride, b.threads);

  std::vector<PairingRun> runs;
  for (const Pairing& p : pairings) {
    for (bool per_row : {false, true}) runs.push_back(run_pairing(b, p, per_row));
  }
  bool passed = true;
  for (const PairingRun& r : runs) passed = passed && r.differ == 0 && r.replicated;
  if (o.json) {
    nlohmann::json j;
    j["command"] = "rollout";
    j["rows"] = o.rows;
    j["real_vocab"] = o.real_vocab;
    j["dtype"] = o.dtype;
    j["passed"] = passed;
    j["runs"] = nlohmann::json::array();
    for (const PairingRun& r : runs) {
      j["runs"].push_back({{"rollout_tp", r.pairing.rollout_tp},
                           {"train_tp", r.pairing.train_tp},
                           {"sampling", r.sampling},
                           {"tokens", r.tokens},
                           {"restricted", r.restricted},
                           {"greedy", r.greedy},
                           {"differ", r.differ},
                           {"plain_differ", r.plain_differ},
                           {"replicated", r.replicated},
                           {"tokens_sha256", r.tokens_sha256}});
    }
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << fmt::format(
        "detlogp rollout: {} rows, real vocab {}, {}: sampled at vLLM's layout, scored at "
        "Megatron's\n",
        o.rows, o.real_vocab, o.dtype);
    Table t({"rollout", "trainer", "sampling", "tokens", "restricted", "greedy", "differ",
             "plain fp32 differ"});
    for (const PairingRun& r : runs) {
      t.add_row({fmt::format("vLLM TP {}", r.pairing.rollout_tp),
                 fmt::format("Megatron TP {}", r.pairing.train_tp), r.sampling,
                 std::to_string(r.tokens), std::to_string(r.restricted), std::to_string(r.greedy),
                 std::to_string(r.differ), std::to_string(r.plain_differ)});
    }
    std::cout << t.str()
              << (passed ? "passed: no token's logprob differs in any bit between the rollout "
                           "and the trainer\n"
                         : "FAILED: tokens whose logprobs differ between the rollout and the "
                           "trainer (or rollout ranks that disagree)\n");
  }
  return passed ? kExitOk : kExitCheckFailed;
}

}  // namespace detlogp::cli
