#include "run_report.hpp"

#include <fmt/format.h>

#include <iostream>

#include "digest.hpp"
#include "run_checks.hpp"
#include "table.hpp"

namespace detlogp::cli {

Digests compute_digests(std::span<const float> logp, std::span<const float> lse,
                        std::span<const float> entropy, const LogitsView& grad, int64_t real) {
  Digests d;
  d.logp = sha256_hex(std::as_bytes(logp));
  d.lse = sha256_hex(std::as_bytes(lse));
  d.entropy = sha256_hex(std::as_bytes(entropy));
  Sha256 g;
  const std::size_t esz = dtype_size(grad.dtype);
  const auto* base = static_cast<const std::byte*>(grad.data);
  for (int64_t r = 0; r < grad.rows; ++r) {
    g.update({base + static_cast<std::size_t>(r * grad.row_stride) * esz,
              static_cast<std::size_t>(real) * esz});
  }
  d.grad_logits = g.hex();
  return d;
}

RunReport start_run_report(const RunOptions& options, std::string comm, int threads,
                           const SyntheticRows& rows) {
  RunReport report;
  report.options = options;
  report.comm = std::move(comm);
  report.threads = threads;
  for (bool a : rows.active) report.active_tokens += a ? 1 : 0;
  return report;
}

TpRunReport judge_tp_run(const RunOptions& o, const SyntheticSpec& spec, const SyntheticRows& rows,
                         const RankScore& rank0, const VocabLayout& layout, const RunOutputs& out) {
  TpRunReport r;
  r.tp = static_cast<int64_t>(layout.vocab_shard_bounds.size());
  r.cp = o.cp;
  r.padded_vocab = layout.padded_vocab_size;
  r.actual_backend = rank0.actual_backend;
  r.kernel = rank0.kernel;
  r.contract_fingerprint = rank0.contract_fingerprint;
  r.provenance = nlohmann::json::parse(rank0.provenance_json);
  r.digests = compute_digests(out.logp, out.lse, out.entropy, out.grad, o.real_vocab);
  r.accuracy = check_sampled_rows(spec, rows, o.temperature, o.softcap, out.logp, out.lse,
                                  out.entropy, out.grad);
  return r;
}

int print_run_report(const RunReport& report) {
  if (report.options.json) {
    std::cout << run_report_json(report).dump(2) << "\n";
  } else {
    std::cout << format_run_report(report);
  }
  std::cout.flush();
  return report.passed() ? kExitOk : kExitCheckFailed;
}

bool RunReport::bitwise_passed() const {
  for (const auto& r : runs) {
    if (!r.replicated || !r.padding_grad_zero || !r.bitwise_equal) return false;
  }
  return !runs.empty();
}

bool RunReport::accuracy_passed() const {
  for (const auto& r : runs) {
    if (!r.accuracy.passed) return false;
  }
  return !runs.empty();
}

std::string format_run_report(const RunReport& rep) {
  const RunOptions& o = rep.options;
  std::string out;
  out += fmt::format(
      "detlogp run: {} tokens ({} active) x {} real vocab, {}, tile width {}, temperature {}, "
      "{}batch key {}\n",
      o.tokens, rep.active_tokens, o.real_vocab, o.dtype, o.tile_width, o.temperature,
      o.softcap ? fmt::format("softcap {}, ", *o.softcap) : std::string(), o.batch_key);
  const TpRunReport& first = rep.runs.front();
  out += fmt::format("backend {} -> {} (kernel {}), {} ({} process{}), {} thread{}\n", o.backend,
                     first.actual_backend, first.kernel, rep.comm, rep.world_size,
                     rep.world_size == 1 ? "" : "es", rep.threads, rep.threads == 1 ? "" : "s");
  if (rep.device != "cpu") out += fmt::format("device {}\n", rep.device);
  out += "forward with entropy; backward with grad_logp, grad_lse and grad_entropy\n\n";
  Table t({"TP", "CP", "padded", "fwd", "bwd", "fwd elem/s", "bwd elem/s", "bitwise", "max|dlogp|",
           "max|dLSE|", "max|dH|", "max|dgrad|", "accuracy"});
  for (const auto& r : rep.runs) {
    const double elements = static_cast<double>(o.tokens) * static_cast<double>(r.padded_vocab);
    const bool bitwise = r.replicated && r.padding_grad_zero && r.bitwise_equal;
    t.add_row({std::to_string(r.tp), std::to_string(r.cp), std::to_string(r.padded_vocab),
               fmt_seconds(r.forward_seconds), fmt_seconds(r.backward_seconds),
               fmt_rate(elements / r.forward_seconds), fmt_rate(elements / r.backward_seconds),
               bitwise ? "equal" : "DIFFERS", fmt_error(r.accuracy.logp), fmt_error(r.accuracy.lse),
               fmt_error(r.accuracy.entropy), fmt_error(r.accuracy.grad),
               r.accuracy.passed ? "pass" : "FAIL"});
  }
  out += t.str();
  if (rep.runs.size() > 1) {
    out += fmt::format(
        "\nbitwise: logp, LSE, entropy and the gradient's real columns (SHA-256) against TP={}, "
        "every TP rank replicated, padding gradient +0\n",
        first.tp);
  } else {
    out +=
        "\nbitwise: every TP rank replicated, padding gradient +0 (compare the digests with "
        "another run's)\n";
  }
  out += fmt::format(
      "accuracy: {} sampled rows against a float64 reference on the same widened logits; bounds "
      "{:g} + {:g} |LSE| (logp, LSE), {:g} (entropy) and {:g} / T + {:g} |grad| + half an ulp of "
      "{} (gradient){}\n",
      first.accuracy.rows, kValueAtol, kValueRtol, kValueAtol, kGradAtol, kGradRtol, o.dtype,
      o.softcap ? "; logp, LSE and entropy + 6 2^-23 softcap / T (the cap's rounding)" : "");
  out += fmt::format("digests (TP={}): logp {} lse {} entropy {} grad_logits {}\n", first.tp,
                     first.digests.logp.substr(0, 16), first.digests.lse.substr(0, 16),
                     first.digests.entropy.substr(0, 16), first.digests.grad_logits.substr(0, 16));
  if (rep.passed()) {
    out += "result: PASS (every output bitwise equal across TP degrees, accuracy within bounds)\n";
  } else {
    out += fmt::format("result: FAIL ({}{})\n", rep.bitwise_passed() ? "" : "bitwise check failed",
                       rep.accuracy_passed()  ? ""
                       : rep.bitwise_passed() ? "accuracy check failed"
                                              : "; accuracy check failed");
  }
  return out;
}

nlohmann::json run_report_json(const RunReport& rep) {
  using nlohmann::json;
  const RunOptions& o = rep.options;
  json j;
  j["command"] = "run";
  j["comm"] = rep.comm;
  j["world_size"] = rep.world_size;
  if (rep.device != "cpu") j["device"] = rep.device;  // --device cuda only
  j["options"] = {{"tokens", o.tokens},
                  {"real_vocab", o.real_vocab},
                  {"dtype", o.dtype},
                  {"tile_width", o.tile_width},
                  {"threads", rep.threads},
                  {"batch_key", o.batch_key},
                  {"temperature", std::stod(fmt::format("{}", o.temperature))},
                  {"backend", o.backend}};
  if (o.softcap) j["options"]["softcap"] = std::stod(fmt::format("{}", *o.softcap));
  j["active_tokens"] = rep.active_tokens;
  const TpRunReport& first = rep.runs.front();
  j["provenance"] = first.provenance;
  j["contract_fingerprint"] = first.contract_fingerprint;
  json digests = json::object();
  json runs = json::array();
  for (const auto& r : rep.runs) {
    digests[std::to_string(r.tp)] = {{"logp", r.digests.logp},
                                     {"lse", r.digests.lse},
                                     {"entropy", r.digests.entropy},
                                     {"grad_logits", r.digests.grad_logits}};
    const double elements = static_cast<double>(o.tokens) * static_cast<double>(r.padded_vocab);
    runs.push_back({{"tp", r.tp},
                    {"cp", r.cp},
                    {"padded_vocab", r.padded_vocab},
                    {"actual_backend", r.actual_backend},
                    {"kernel", r.kernel},
                    {"contract_fingerprint", r.contract_fingerprint},
                    {"provenance", r.provenance},
                    {"forward_seconds", r.forward_seconds},
                    {"backward_seconds", r.backward_seconds},
                    {"forward_elements_per_second", elements / r.forward_seconds},
                    {"backward_elements_per_second", elements / r.backward_seconds},
                    {"replicated", r.replicated},
                    {"padding_grad_zero", r.padding_grad_zero},
                    {"bitwise_equal", r.bitwise_equal},
                    {"accuracy",
                     {{"rows", r.accuracy.rows},
                      {"max_abs_logp", r.accuracy.logp},
                      {"max_abs_lse", r.accuracy.lse},
                      {"max_abs_entropy", r.accuracy.entropy},
                      {"max_abs_grad", r.accuracy.grad},
                      {"max_grad_error_over_bound", r.accuracy.grad_over_bound},
                      {"inactive_logp_zero", r.accuracy.inactive_logp_zero},
                      {"passed", r.accuracy.passed}}}});
  }
  j["digests"] = digests;
  j["runs"] = runs;
  j["tolerances"] = {{"value_atol", kValueAtol},
                     {"value_rtol_of_lse", kValueRtol},
                     {"grad_atol_times_temperature", kGradAtol},
                     {"grad_rtol", kGradRtol},
                     {"grad_rounding", "half an ulp of the logits dtype at |reference|"}};
  j["checks"] = {{"bitwise", rep.bitwise_passed()},
                 {"accuracy", rep.accuracy_passed()},
                 {"passed", rep.passed()}};
  return j;
}

}  // namespace detlogp::cli
