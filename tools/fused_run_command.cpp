// `detlogp run --fused`: the fused lm_head on a keyed Qwen3-like shape (hidden states
// [tokens, H], an lm_head weight [padded, H] in the run's dtype) at every requested TP degree on
// the in-process rank group: forward with entropy and backward into both the hidden states and
// each rank's weight shard. Checked bitwise: the fused outputs against linear_logits + the
// registry's operator at TP=1, and every output against TP=1 on every rank of every degree.
// The logits are never materialised by the fused path (only by the reference, [tokens, R]).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "detlogp/comm.hpp"
#include "detlogp/fused.hpp"
#include "detlogp/registry.hpp"
#include "digest.hpp"
#include "numerics/canon.hpp"
#include "progress.hpp"
#include "run_checks.hpp"
#include "synthetic.hpp"
#include "table.hpp"

namespace detlogp::cli {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A value in about N(0, scale^2) (sum of three uniforms) that is a pure function of the run's
// number and the element index, stored in `dtype`.
void fill(std::vector<uint8_t>& out, DType dtype, int64_t rows, int64_t cols, uint64_t salt,
          double scale, int threads) {
  const std::size_t esz = dtype_size(dtype);
  out.resize(static_cast<std::size_t>(rows * cols) * esz);
  auto work = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const uint64_t i = static_cast<uint64_t>(r * cols + c);
        const uint64_t h = mix(salt ^ mix(i));
        const double u = static_cast<double>(h & 0x1fffff) +
                         static_cast<double>((h >> 21) & 0x1fffff) +
                         static_cast<double>((h >> 42) & 0x1fffff);
        const auto v = static_cast<float>((u / 2097152.0 - 1.5) * 2.0 * scale);
        uint8_t* at = out.data() + static_cast<std::size_t>(i) * esz;
        if (dtype == DType::fp32) {
          std::memcpy(at, &v, 4);
        } else {
          const uint16_t b =
              dtype == DType::bf16 ? canon::float_to_bf16(v) : canon::float_to_fp16(v);
          std::memcpy(at, &b, 2);
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t)
    pool.emplace_back(work, rows * t / threads, rows * (t + 1) / threads);
  work(0, rows / threads);
  for (auto& th : pool) th.join();
}

struct TpOutputs {
  double forward_s = 0, backward_s = 0;
  std::vector<FusedLogprobResult> ranks;
  std::vector<std::vector<uint8_t>> grad_hidden;  // per rank, [tokens, H] in dtype
  std::vector<uint8_t> grad_weight;               // [padded, H] in dtype, shards joined
};

LogprobContract contract_for(const RunOptions& o, DType dtype, const VocabLayout& l, int rank,
                             const SyntheticRows& rows) {
  return LogprobContract(
      {.role = Role::train,
       .dtype = dtype,
       .mask = MaskSpec(
           {.num_tokens = o.tokens, .active_mask = rows.active, .ignore_index = kIgnoreIndex}),
       .sharding = ShardingSpec({.tp_rank = rank,
                                 .tp_world_size = static_cast<int64_t>(l.vocab_shard_bounds.size()),
                                 .vocab_shard_bounds = l.vocab_shard_bounds,
                                 .real_vocab_size = o.real_vocab,
                                 .padded_vocab_size = l.padded_vocab_size}),
       .temperature = o.temperature,
       .tile_width = o.tile_width});
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string short_digest(std::span<const std::byte> bytes) {
  return sha256_hex(bytes).substr(0, 16);
}

template <class T>
std::string short_digest(const std::vector<T>& v) {
  return short_digest(std::as_bytes(std::span<const T>(v)));
}

}  // namespace

int fused_run_command(const RunOptions& o) {
  // Everything that needs no data first, with the same checks as `run` (run_checks.hpp).
  check_run_options(o);
  if (o.comm == "mpi") throw UsageError("--fused runs on the in-process group; drop --comm mpi");
  if (o.device != "cpu") throw UsageError("--fused runs on the CPU; drop --device " + o.device);
  const std::vector<int64_t> tps = in_process_tps(o);
  const std::chrono::milliseconds timeout = parse_collective_timeout(o.collective_timeout);
  const DType dtype = parse_dtype(o.dtype, "--dtype");
  const int threads = resolve_threads(o.threads);
  const int64_t hs = o.hidden;
  const std::size_t esz = dtype_size(dtype);
  const SyntheticSpec spec{
      .tokens = o.tokens, .real_vocab = o.real_vocab, .dtype = dtype, .key = o.batch_key};

  std::vector<VocabLayout> layouts;
  int64_t padded_max = o.real_vocab;
  uint64_t ranks_total = 0;
  for (int64_t tp : tps) {
    layouts.push_back(run_layout(o.real_vocab, tp, o.tile_width));
    padded_max = std::max(padded_max, layouts.back().padded_vocab_size);
    ranks_total += static_cast<uint64_t>(tp);
  }
  // What the run holds at once: the inputs, the reference's fp32 logits, and every degree's
  // gradients (kept for the bitwise comparison).
  const auto tokens = static_cast<uint64_t>(o.tokens), h = static_cast<uint64_t>(hs);
  const auto padded = static_cast<uint64_t>(padded_max), real = static_cast<uint64_t>(o.real_vocab);
  const RunBuffer buffers[] = {
      {.name = "the hidden states", .rows = tokens, .cols = h, .element_size = esz},
      {.name = "the lm_head weight", .rows = padded, .cols = h, .element_size = esz},
      {.name = "the reference logits", .rows = tokens, .cols = real, .element_size = 4},
      {.name = "a hidden-state gradient per rank",
       .count = ranks_total,
       .rows = tokens,
       .cols = h,
       .element_size = esz},
      {.name = "a weight gradient per TP degree",
       .count = tps.size(),
       .rows = padded,
       .cols = h,
       .element_size = esz}};
  require_run_memory(buffers,
                     fmt::format("--tokens {} x --hidden {} x {} columns of {}", o.tokens, hs,
                                 padded_max, o.dtype),
                     "use fewer --tokens or a smaller --hidden");
  const SyntheticRows rows = synthetic_rows(spec, 0, o.tokens);

  Progress progress(true);
  progress.step("[run --fused] generating hidden states and lm_head weight...");
  std::vector<uint8_t> hidden, weight;
  fill(hidden, dtype, o.tokens, hs, o.batch_key, 1.0, threads);
  // Logit scale about 2.5: weight entries ~ N(0, (2.5 / sqrt(H))^2).
  fill(weight, dtype, padded_max, hs, o.batch_key + 1, 2.5 / std::sqrt(static_cast<double>(hs)),
       threads);
  const LogitsView hidden_view{hidden.data(), dtype, o.tokens, hs, hs};
  const FusedLinearLogprob op;

  // Reference: linear_logits at TP=1 + the registry's operator on those fp32 logits.
  progress.step("[run --fused] reference: linear_logits + operator...");
  const auto t_ref = std::chrono::steady_clock::now();
  std::vector<float> logits(static_cast<std::size_t>(o.tokens * o.real_vocab));
  linear_logits(hidden_view, LogitsView{weight.data(), dtype, o.real_vocab, hs, hs},
                MutableLogitsView{logits.data(), DType::fp32, o.tokens, o.real_vocab, o.real_vocab},
                {.threads = threads});
  const VocabLayout ref_layout{o.real_vocab, {{0, o.real_vocab}}};
  const LogprobContract ref_contract = contract_for(o, DType::fp32, ref_layout, 0, rows);
  const DispatchResult d = get_logprob_op(ref_contract, o.backend);
  SelfComm self;
  const LogprobResult ref = d.op->forward(
      LogitsView{logits.data(), DType::fp32, o.tokens, o.real_vocab, o.real_vocab}, rows.targets,
      ref_contract, self, {.entropy = true, .exec = {.threads = threads}});
  const double ref_s = seconds_since(t_ref);

  std::vector<TpOutputs> runs;
  for (const VocabLayout& l : layouts) {
    const int tp = static_cast<int>(l.vocab_shard_bounds.size());
    progress.step(fmt::format("[run --fused] TP={}: forward + backward...", tp));
    TpOutputs out;
    out.ranks.resize(static_cast<std::size_t>(tp));
    out.grad_hidden.resize(static_cast<std::size_t>(tp));
    out.grad_weight.assign(static_cast<std::size_t>(l.padded_vocab_size * hs) * esz, 0xff);
    std::vector<double> fwd_s(static_cast<std::size_t>(tp)), bwd_s(static_cast<std::size_t>(tp));
    run_ranks(
        tp,
        [&](Communicator& comm) {
          const int r = comm.rank();
          const VocabRange b = l.vocab_shard_bounds[static_cast<std::size_t>(r)];
          const LogprobContract c = contract_for(o, dtype, l, r, rows);
          const FusedOptions fo{.entropy = true, .exec = {.threads = rank_threads(threads, tp, r)}};
          const auto t0 = std::chrono::steady_clock::now();
          FusedLogprobResult res = op.forward(
              hidden_view, LogitsView{weight.data() + b.start * hs * esz, dtype, b.size(), hs, hs},
              rows.targets, c, comm, fo);
          fwd_s[r] = seconds_since(t0);
          std::vector<uint8_t>& gh = out.grad_hidden[static_cast<std::size_t>(r)];
          gh.resize(hidden.size());
          const auto t1 = std::chrono::steady_clock::now();
          op.backward(res,
                      {.grad_logp = rows.grad_logp,
                       .grad_lse = rows.grad_lse,
                       .grad_entropy = rows.grad_entropy},
                      MutableLogitsView{gh.data(), dtype, o.tokens, hs, hs},
                      MutableLogitsView{out.grad_weight.data() + b.start * hs * esz, dtype,
                                        b.size(), hs, hs},
                      comm);
          bwd_s[r] = seconds_since(t1);
          out.ranks[static_cast<std::size_t>(r)] = std::move(res);
        },
        {.collective_timeout = timeout});
    out.forward_s = *std::max_element(fwd_s.begin(), fwd_s.end());
    out.backward_s = *std::max_element(bwd_s.begin(), bwd_s.end());
    runs.push_back(std::move(out));
  }
  progress.clear();

  // Checks (raw bits).
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  };
  const FusedLogprobResult& base = runs[0].ranks[0];
  const bool vs_reference =
      same(base.logp, ref.logp) && same(base.lse, ref.lse) && same(base.entropy, ref.entropy);
  bool outputs_across = true, hidden_across = true, weight_across = true;
  const std::size_t real_bytes = static_cast<std::size_t>(o.real_vocab * hs) * esz;
  for (const TpOutputs& run : runs) {
    for (std::size_t r = 0; r < run.ranks.size(); ++r) {
      outputs_across = outputs_across && same(run.ranks[r].logp, base.logp) &&
                       same(run.ranks[r].lse, base.lse) && same(run.ranks[r].entropy, base.entropy);
      hidden_across = hidden_across && run.grad_hidden[r] == runs[0].grad_hidden[0];
    }
    weight_across = weight_across && std::memcmp(run.grad_weight.data(), runs[0].grad_weight.data(),
                                                 real_bytes) == 0;
  }

  const double flop = 2.0 * static_cast<double>(o.tokens) * static_cast<double>(o.real_vocab) *
                      static_cast<double>(hs);
  auto weight_digest = [&](const TpOutputs& run) {
    return short_digest(std::span<const std::byte>(
        reinterpret_cast<const std::byte*>(run.grad_weight.data()), real_bytes));
  };
  const bool passed = vs_reference && outputs_across && hidden_across && weight_across;
  if (o.json) {
    nlohmann::json j;
    j["command"] = "run --fused";
    j["options"] = {{"tokens", o.tokens},         {"hidden", hs},
                    {"real_vocab", o.real_vocab}, {"dtype", o.dtype},
                    {"tile_width", o.tile_width}, {"threads", threads}};
    j["kernel"] = op.kernel_name();
    j["reference_backend"] = d.actual_backend;
    for (std::size_t k = 0; k < runs.size(); ++k) {
      const TpOutputs& run = runs[k];
      j["runs"].push_back({{"tp", layouts[k].vocab_shard_bounds.size()},
                           {"padded_vocab", layouts[k].padded_vocab_size},
                           {"forward_seconds", run.forward_s},
                           {"backward_seconds", run.backward_s},
                           {"digests",
                            {{"logp", short_digest(run.ranks[0].logp)},
                             {"lse", short_digest(run.ranks[0].lse)},
                             {"entropy", short_digest(run.ranks[0].entropy)},
                             {"grad_hidden", short_digest(run.grad_hidden[0])},
                             {"grad_weight", weight_digest(run)}}}});
    }
    j["checks"] = {{"fused_equals_reference", vs_reference},
                   {"outputs_across_tp", outputs_across},
                   {"grad_hidden_across_tp", hidden_across},
                   {"grad_weight_across_tp", weight_across},
                   {"passed", passed}};
    std::cout << j.dump(2) << "\n";
    return passed ? kExitOk : kExitCheckFailed;
  }
  std::cout << fmt::format(
      "detlogp run --fused: hidden [{}, {}] and lm_head [{}, {}] {}, tile width {}, kernels {}, "
      "{} threads\n",
      o.tokens, hs, o.real_vocab, hs, o.dtype, o.tile_width, op.kernel_name(), threads);
  std::cout << fmt::format("reference (linear_logits + {} at TP=1): {:.2f} s\n", d.actual_backend,
                           ref_s);
  Table table({"TP", "padded", "forward s", "fwd GFLOP/s", "backward s", "logp", "lse", "entropy",
               "grad_hidden", "grad_weight"});
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const TpOutputs& run = runs[k];
    table.add_row(
        {std::to_string(layouts[k].vocab_shard_bounds.size()),
         std::to_string(layouts[k].padded_vocab_size), fmt::format("{:.2f}", run.forward_s),
         fmt::format("{:.1f}", flop / run.forward_s / 1e9), fmt::format("{:.2f}", run.backward_s),
         short_digest(run.ranks[0].logp), short_digest(run.ranks[0].lse),
         short_digest(run.ranks[0].entropy), short_digest(run.grad_hidden[0]),
         short_digest(std::span<const std::byte>(
             reinterpret_cast<const std::byte*>(run.grad_weight.data()), real_bytes))});
  }
  std::cout << table.str();
  auto verdict = [](bool ok) { return ok ? "yes" : "NO"; };
  std::cout << fmt::format("fused == linear_logits + operator (logp, lse, entropy): {}\n",
                           verdict(vs_reference));
  std::cout << fmt::format(
      "logp, lse, entropy bitwise equal on every rank of every TP degree: {}\n",
      verdict(outputs_across));
  std::cout << fmt::format("grad_hidden bitwise equal on every rank of every TP degree: {}\n",
                           verdict(hidden_across));
  std::cout << fmt::format(
      "grad_weight (real rows, shards joined) bitwise equal across TP degrees: {}\n",
      verdict(weight_across));
  return vs_reference && outputs_across && hidden_across && weight_across ? kExitOk
                                                                          : kExitCheckFailed;
}

}  // namespace detlogp::cli
