// `detlogp drift`: the drift report of a candidate logprob file against a reference one
// (detlogp/drift.hpp, the library's statistics), printed as text or JSON; exit 1 when the verdict
// is fail.

#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "detlogp/drift.hpp"
#include "detlogp/enums.hpp"
#include "io/tensor_file.hpp"

namespace detlogp::cli {
namespace {

// A 1-D F32 tensor; in a .safetensors file with several tensors, the one named "logp" (what
// `detlogp logprob` writes).
std::vector<float> read_logprobs(const std::string& path, io::Tensor& t) {
  t = io::read_tensor(path, "logp");
  std::vector<float> v = io::to_float_vector(t, path);
  if (t.shape.size() != 1) {
    throw ContractError(
        fmt::format("{}: tensor '{}' has shape {}; expected [tokens] (1-D logprobs)", path, t.name,
                    io::format_shape(t.shape)));
  }
  return v;
}

nlohmann::json optional_index(const std::optional<int64_t>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json to_json(const DriftReport& r, const DriftOptions& o) {
  nlohmann::json worst = nullptr;
  if (r.worst_index) {
    worst = {{"index", *r.worst_index},
             {"candidate", r.worst_candidate},
             {"reference", r.worst_reference},
             {"abs_diff", r.max_abs}};
  }
  return {{"command", "drift"},
          {"candidate", o.candidate},
          {"reference", o.reference},
          {"mask", o.mask.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.mask)},
          {"dtype", o.dtype},
          {"tokens", r.tokens},
          {"count", r.count},
          {"max_abs", r.max_abs},
          {"mean_abs", r.mean_abs},
          {"p95_abs", r.p95_abs},
          {"p99_abs", r.p99_abs},
          {"max_rel", r.max_rel},
          {"worst", worst},
          {"approx_kl0", r.approx_kl0},
          {"clipfrac0", r.clipfrac0},
          {"non_finite", r.non_finite},
          {"first_non_finite", optional_index(r.first_non_finite)},
          {"thresholds",
           {{"max_abs", r.thresholds.max_abs},
            {"approx_kl0", r.thresholds.approx_kl0},
            {"clipfrac0", r.thresholds.clipfrac0},
            {"clip", {r.thresholds.clip_low, r.thresholds.clip_high}}}},
          {"failures", r.failures},
          {"passed", r.passed()}};
}

std::string to_text(const DriftReport& r, const DriftOptions& o) {
  std::string s =
      fmt::format("detlogp drift: candidate {} vs reference {} ({})\n", o.candidate, o.reference,
                  o.mask.empty() ? "every token active" : "mask " + o.mask);
  s += fmt::format("active tokens   {} of {}\n", r.count, r.tokens);
  s += fmt::format("max_abs         {:.6g}   (<= {:g} for {})\n", r.max_abs, r.thresholds.max_abs,
                   o.dtype);
  s += fmt::format("mean_abs        {:.6g}\n", r.mean_abs);
  s += fmt::format("p95_abs         {:.6g}\n", r.p95_abs);
  s += fmt::format("p99_abs         {:.6g}\n", r.p99_abs);
  s += fmt::format("max_rel         {:.6g}\n", r.max_rel);
  if (r.worst_index) {
    s += fmt::format("worst token     {} (candidate {:.9g}, reference {:.9g})\n", *r.worst_index,
                     r.worst_candidate, r.worst_reference);
  }
  s += fmt::format("approx_kl0      {:.6g}   (<= {:g})\n", r.approx_kl0, r.thresholds.approx_kl0);
  s += fmt::format("clipfrac0       {:.6g}   (<= {:g}, clip [{:g}, {:g}])\n", r.clipfrac0,
                   r.thresholds.clipfrac0, r.thresholds.clip_low, r.thresholds.clip_high);
  if (r.non_finite > 0) s += fmt::format("non-finite      {}\n", r.non_finite);
  if (r.passed()) {
    s += "verdict         PASS\n";
  } else {
    std::string why;
    for (const auto& f : r.failures) why += (why.empty() ? "" : "; ") + f;
    s += "verdict         FAIL (" + why + ")\n";
  }
  return s;
}

}  // namespace

int drift_command(const DriftOptions& o) {
  const DType dtype = parse_dtype(o.dtype, "--dtype");
  io::Tensor cand_t, ref_t;
  const std::vector<float> candidate = read_logprobs(o.candidate, cand_t);
  const std::vector<float> reference = read_logprobs(o.reference, ref_t);
  if (reference.size() != candidate.size()) {
    throw ContractError(fmt::format("{}: tensor '{}' has shape {}; expected [{}] (the shape of {})",
                                    o.reference, ref_t.name, io::format_shape(ref_t.shape),
                                    candidate.size(), o.candidate));
  }
  std::vector<uint8_t> mask;
  if (!o.mask.empty()) {
    const io::Tensor mask_t = io::read_tensor(o.mask, "mask");
    mask = io::to_mask_vector(mask_t, o.mask);
    if (mask_t.shape.size() != 1 || mask.size() != candidate.size()) {
      throw ContractError(
          fmt::format("{}: tensor '{}' has shape {}; expected [{}] (the shape of {})", o.mask,
                      mask_t.name, io::format_shape(mask_t.shape), candidate.size(), o.candidate));
    }
  }
  const DriftReport r = drift_report(candidate, reference, mask, dtype);
  if (o.json) {
    std::cout << to_json(r, o).dump(2) << "\n";
  } else {
    std::cout << to_text(r, o);
  }
  return r.passed() ? kExitOk : kExitCheckFailed;
}

}  // namespace detlogp::cli
