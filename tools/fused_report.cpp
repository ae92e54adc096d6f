#include "fused_report.hpp"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <span>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "digest.hpp"
#include "table.hpp"

namespace detlogp::cli {
namespace {

std::string short_digest(std::span<const std::byte> bytes) {
  return sha256_hex(bytes).substr(0, 16);
}

template <class T>
std::string short_digest(const std::vector<T>& v) {
  return short_digest(std::as_bytes(std::span<const T>(v)));
}

// The weight gradient's real rows (padding rows are the ranks' own business: +0 or untouched).
std::span<const std::byte> real_weight_rows(const FusedReport& report, const FusedTpRun& run) {
  const RunOptions& o = report.options;
  const std::size_t bytes =
      static_cast<std::size_t>(o.real_vocab * o.hidden) * dtype_size(report.dtype);
  return std::as_bytes(std::span(run.grad_weight)).first(bytes);
}

double slowest(const FusedTpRun& run, double FusedRankScore::*seconds) {
  double s = 0;
  for (const FusedRankScore& r : run.ranks) s = std::max(s, r.*seconds);
  return s;
}

// logp, lse and entropy bitwise equal (of a fused or a logits operator's result).
template <class A, class B>
bool same_outputs(const A& a, const B& b) {
  return same_bits(a.logp, b.logp) && same_bits(a.lse, b.lse) && same_bits(a.entropy, b.entropy);
}

const char* yes_no(bool ok) { return ok ? "yes" : "NO"; }

}  // namespace

void judge_fused_run(FusedReport& report) {
  const FusedTpRun& first = report.runs.front();
  const FusedLogprobResult& base = first.ranks.front().result;
  report.equals_reference = same_outputs(base, report.reference.result);
  report.outputs_across = report.hidden_across = report.weight_across = true;
  const std::span<const std::byte> base_weight = real_weight_rows(report, first);
  for (const FusedTpRun& run : report.runs) {
    for (std::size_t r = 0; r < run.ranks.size(); ++r) {
      report.outputs_across = report.outputs_across && same_outputs(run.ranks[r].result, base);
      report.hidden_across = report.hidden_across && run.grad_hidden[r] == first.grad_hidden[0];
    }
    const std::span<const std::byte> weight = real_weight_rows(report, run);
    report.weight_across =
        report.weight_across && std::memcmp(weight.data(), base_weight.data(), weight.size()) == 0;
  }
}

int print_fused_report(const FusedReport& report) {
  const RunOptions& o = report.options;
  const std::string kernel = report.runs.front().ranks.front().kernel;
  const int exit_code = report.passed() ? kExitOk : kExitCheckFailed;
  if (o.json) {
    nlohmann::json j;
    j["command"] = "run --fused";
    j["options"] = {{"tokens", o.tokens},         {"hidden", o.hidden},
                    {"real_vocab", o.real_vocab}, {"dtype", o.dtype},
                    {"tile_width", o.tile_width}, {"threads", report.threads}};
    j["kernel"] = kernel;
    j["reference_backend"] = report.reference.backend;
    for (const FusedTpRun& run : report.runs) {
      const FusedLogprobResult& r0 = run.ranks.front().result;
      j["runs"].push_back({{"tp", run.tp},
                           {"padded_vocab", run.padded_vocab},
                           {"forward_seconds", slowest(run, &FusedRankScore::forward_seconds)},
                           {"backward_seconds", slowest(run, &FusedRankScore::backward_seconds)},
                           {"digests",
                            {{"logp", short_digest(r0.logp)},
                             {"lse", short_digest(r0.lse)},
                             {"entropy", short_digest(r0.entropy)},
                             {"grad_hidden", short_digest(run.grad_hidden[0])},
                             {"grad_weight", short_digest(real_weight_rows(report, run))}}}});
    }
    j["checks"] = {{"fused_equals_reference", report.equals_reference},
                   {"outputs_across_tp", report.outputs_across},
                   {"grad_hidden_across_tp", report.hidden_across},
                   {"grad_weight_across_tp", report.weight_across},
                   {"passed", report.passed()}};
    std::cout << j.dump(2) << "\n";
    return exit_code;
  }
  std::cout << fmt::format(
      "detlogp run --fused: hidden [{}, {}] and lm_head [{}, {}] {}, tile width {}, kernels {}, "
      "{} threads\n",
      o.tokens, o.hidden, o.real_vocab, o.hidden, o.dtype, o.tile_width, kernel, report.threads);
  std::cout << fmt::format("reference (linear_logits + {} at TP=1): {:.2f} s\n",
                           report.reference.backend, report.reference.seconds);
  const double flop = 2.0 * static_cast<double>(o.tokens) * static_cast<double>(o.real_vocab) *
                      static_cast<double>(o.hidden);
  Table table({"TP", "padded", "forward s", "fwd GFLOP/s", "backward s", "logp", "lse", "entropy",
               "grad_hidden", "grad_weight"});
  for (const FusedTpRun& run : report.runs) {
    const FusedLogprobResult& r0 = run.ranks.front().result;
    const double forward_s = slowest(run, &FusedRankScore::forward_seconds);
    table.add_row({std::to_string(run.tp), std::to_string(run.padded_vocab),
                   fmt::format("{:.2f}", forward_s), fmt::format("{:.1f}", flop / forward_s / 1e9),
                   fmt::format("{:.2f}", slowest(run, &FusedRankScore::backward_seconds)),
                   short_digest(r0.logp), short_digest(r0.lse), short_digest(r0.entropy),
                   short_digest(run.grad_hidden[0]), short_digest(real_weight_rows(report, run))});
  }
  std::cout << table.str();
  std::cout << fmt::format("fused == linear_logits + operator (logp, lse, entropy): {}\n",
                           yes_no(report.equals_reference));
  std::cout << fmt::format(
      "logp, lse, entropy bitwise equal on every rank of every TP degree: {}\n",
      yes_no(report.outputs_across));
  std::cout << fmt::format("grad_hidden bitwise equal on every rank of every TP degree: {}\n",
                           yes_no(report.hidden_across));
  std::cout << fmt::format(
      "grad_weight (real rows, shards joined) bitwise equal across TP degrees: {}\n",
      yes_no(report.weight_across));
  return exit_code;
}

}  // namespace detlogp::cli
