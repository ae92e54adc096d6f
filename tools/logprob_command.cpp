// `detlogp logprob`: logprobs, LSE, entropy and the logits gradient of tensors read from
// .safetensors / .npy files (docs/file-formats.md), computed through the registry on an
// in-process TP group, written atomically to one .safetensors file.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli.hpp"
#include "detlogp/version.hpp"
#include "device.hpp"
#include "io/file.hpp"
#include "io/tensor_file.hpp"
#include "memory/memory.hpp"
#include "op/call_checks.hpp"
#include "op/kept_selection.hpp"
#include "op/kept_sets.hpp"
#include "scoring.hpp"

namespace detlogp::cli {
namespace {

// A [tokens] tensor of one value per token of the logits, else ContractError naming the file.
void check_per_token(const io::Tensor& t, const std::string& path, int64_t tokens,
                     const std::string& logits_path) {
  if (t.shape.size() != 1 || t.shape[0] != tokens) {
    throw ContractError(
        fmt::format("{}: tensor '{}' has shape {}; expected [{}] (one value per token of {})", path,
                    t.name, io::format_shape(t.shape), tokens, logits_path));
  }
}

std::vector<float> read_grad(const std::string& path, const char* name, int64_t tokens,
                             const std::string& logits_path) {
  if (path.empty()) return {};
  const io::Tensor t = io::read_tensor(path, name);
  std::vector<float> v = io::to_float_vector(t, path);
  check_per_token(t, path, tokens, logits_path);
  return v;
}

// Whether two paths name the same file: the same inode when both exist, else the same
// normalised absolute path.
bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (std::filesystem::exists(a, ec) && std::filesystem::exists(b, ec)) {
    const bool same = std::filesystem::equivalent(a, b, ec);
    if (!ec) return same;
  }
  const auto norm = [](const std::string& p) {
    std::error_code e;
    const auto w = std::filesystem::weakly_canonical(std::filesystem::absolute(p, e), e);
    return e ? std::filesystem::path(p).lexically_normal() : w;
  };
  return norm(a) == norm(b);
}

int64_t resolve_tile_width(const LogprobOptions& o, int64_t padded) {
  if (o.num_vocab_tiles) {
    const int64_t k = *o.num_vocab_tiles;
    if (k <= 0 || padded % k != 0) {
      throw UsageError(
          fmt::format("--num-vocab-tiles {} must be > 0 and divide the padded vocabulary {} of {}",
                      k, padded, o.logits));
    }
    return padded / k;
  }
  const int64_t w = o.tile_width.value_or(kDefaultTileWidth);
  if (w <= 0) throw UsageError(fmt::format("--tile-width must be > 0; got {}", w));
  return w;
}

// The checks of the options alone, so that nothing is read (or computed) for a command that
// cannot succeed.
void check_logprob_options(const LogprobOptions& o) {
  if (io::tensor_file_format(o.out) != io::TensorFileFormat::safetensors) {
    throw UsageError(fmt::format(
        "{}: --out must be a .safetensors file (it holds logp, lse, entropy, grad_logits)", o.out));
  }
  // No output may overwrite another output or an input (the provenance would replace the
  // tensors; an input would be replaced before a later run could read it again).
  if (!o.provenance.empty() && same_file(o.provenance, o.out)) {
    throw UsageError(
        fmt::format("--provenance {} names the same file as --out; give it its own "
                    "path (e.g. {}.provenance.json)",
                    o.provenance, o.out));
  }
  for (const std::string* input : {&o.logits, &o.targets, &o.mask, &o.row_temperature, &o.kept_ids,
                                   &o.grad_logp, &o.grad_lse, &o.grad_entropy}) {
    if (input->empty()) continue;
    for (const std::string* output : {&o.out, &o.provenance}) {
      if (!output->empty() && same_file(*input, *output)) {
        throw UsageError(fmt::format(
            "{} is both an input and an output; write the outputs to new paths", *output));
      }
    }
  }
  check_in_process_tp(o.tp, "--tp");
  parse_collective_timeout(o.collective_timeout);
  if (!(std::isfinite(o.temperature) && o.temperature > 0)) {
    throw UsageError(fmt::format("--temperature must be finite and > 0; got {}", o.temperature));
  }
  check_softcap_option(o.softcap);
  if (!o.row_temperature.empty() && o.temperature != 1.0f) {
    throw UsageError(fmt::format(
        "--row-temperature {} gives each token its own temperature, so --temperature must be 1 "
        "(the default); got {}: fold it into the file's values",
        o.row_temperature, o.temperature));
  }
  if (!o.grad_entropy.empty() && !o.entropy) {
    throw UsageError("--grad-entropy needs --entropy (the entropy gradient needs the entropy)");
  }
  if (o.threads < 0) throw UsageError(fmt::format("--threads must be >= 0; got {}", o.threads));
}

bool wants_gradient(const LogprobOptions& o) {
  return !o.grad_logp.empty() || !o.grad_lse.empty() || !o.grad_entropy.empty();
}

// What the files hold, checked against each other.
struct LogprobInputs {
  io::Tensor logits_tensor;
  LogitsView logits;
  int64_t real = 0;
  std::vector<int64_t> targets;
  std::vector<bool> active;
  std::vector<float> row_temperature;  // empty without --row-temperature
  std::vector<int64_t> kept_ids;       // [tokens, kept_width]; empty without --kept-ids
  int64_t kept_width = 0;
  std::vector<int32_t> top_k;  // [tokens] from --top-k; empty without
  std::vector<float> top_p;    // [tokens] from --top-p; empty without
  std::vector<float> grad_logp, grad_lse, grad_entropy;
};

LogprobInputs read_inputs(const LogprobOptions& o) {
  // Memory, up front: the logits and, when any gradient is asked for, a gradient of the same
  // size, against what this process may still allocate (before anything is read).
  const bool gradient = wants_gradient(o);
  {
    const io::TensorInfo info = io::read_tensor_info(o.logits, "logits");
    io::require_memory(
        io::checked_product({info.nbytes, gradient ? 2u : 1u}, "the logits and gradient"),
        fmt::format("{}: the logits {} of {}{}", o.logits, io::format_shape(info.shape),
                    io::dtype_name(info.dtype), gradient ? " and their gradient" : ""),
        gradient ? "use a file with fewer tokens, or no --grad-* options (no gradient)"
                 : "use a file with fewer tokens");
  }
  LogprobInputs in;
  in.logits_tensor = io::read_tensor(o.logits, "logits");
  in.logits = io::as_logits_view(in.logits_tensor, o.logits);
  const int64_t tokens = in.logits.rows, padded = in.logits.cols;
  if (tokens == 0 || padded == 0) {
    throw ContractError(
        fmt::format("{}: tensor '{}' has shape {}; expected [tokens > 0, vocab > 0]", o.logits,
                    in.logits_tensor.name, io::format_shape(in.logits_tensor.shape)));
  }
  const io::Tensor targets_t = io::read_tensor(o.targets, "targets");
  in.targets = io::to_int64_vector(targets_t, o.targets);
  check_per_token(targets_t, o.targets, tokens, o.logits);
  in.active.assign(static_cast<std::size_t>(tokens), true);
  if (!o.mask.empty()) {
    const io::Tensor mask_t = io::read_tensor(o.mask, "mask");
    const std::vector<uint8_t> mask = io::to_mask_vector(mask_t, o.mask);
    check_per_token(mask_t, o.mask, tokens, o.logits);
    for (std::size_t i = 0; i < mask.size(); ++i) in.active[i] = mask[i] != 0;
  }
  in.real = o.real_vocab.value_or(padded);
  if (in.real < 1 || in.real > padded) {
    throw UsageError(fmt::format("--real-vocab {} must be in [1, {}] (the width of {})", in.real,
                                 padded, o.logits));
  }
  for (int64_t i = 0; i < tokens; ++i) {
    if (in.active[i] && (in.targets[i] < 0 || in.targets[i] >= in.real)) {
      throw ContractError(
          fmt::format("{}: target {} of active token {} is outside the real vocabulary [0, {})",
                      o.targets, in.targets[i], i, in.real));
    }
  }
  if (!o.row_temperature.empty()) {
    const io::Tensor t = io::read_tensor(o.row_temperature, "row_temperature");
    in.row_temperature = io::to_float_vector(t, o.row_temperature);
    check_per_token(t, o.row_temperature, tokens, o.logits);
  }
  if (!o.kept_ids.empty()) {
    const io::Tensor t = io::read_tensor(o.kept_ids, "kept_ids");
    in.kept_ids = io::to_int64_vector(t, o.kept_ids);
    if (t.shape.size() != 2 || t.shape[0] != tokens || t.shape[1] < 1) {
      throw ContractError(fmt::format(
          "{}: tensor '{}' has shape {}; expected [{}, K >= 1] (each token's kept ids of {}, "
          "-1 padded)",
          o.kept_ids, t.name, io::format_shape(t.shape), tokens, o.logits));
    }
    in.kept_width = t.shape[1];
  }
  in.grad_logp = read_grad(o.grad_logp, "grad_logp", tokens, o.logits);
  in.grad_lse = read_grad(o.grad_lse, "grad_lse", tokens, o.logits);
  in.grad_entropy = read_grad(o.grad_entropy, "grad_entropy", tokens, o.logits);
  if (o.top_k) in.top_k.assign(static_cast<std::size_t>(tokens), *o.top_k);
  if (o.top_p) in.top_p.assign(static_cast<std::size_t>(tokens), *o.top_p);
  return in;
}

// Every rank of the --tp group on the in-process group (the logits and gradient on the GPU
// under --device cuda); the gradient lands in `grad_t`.
std::vector<RankScore> score(const LogprobOptions& o, const ScoreRequest& req,
                             const LogprobInputs& in, io::Tensor& grad_t, Device device) {
  const bool backward = wants_backward(req.grads);
  const MutableLogitsView grad =
      backward ? io::as_mutable_logits_view(grad_t, o.out) : MutableLogitsView{};
  // --device cuda: the logits (same row stride) and the gradient on the GPU; the gradient
  // comes back into grad_t for the output file.
  LogitsView scored_logits = in.logits;
  MutableLogitsView scored_grad = grad;
  DeviceBuffer device_logits, device_grad;
  if (device != Device::cpu) {
    const std::vector<std::byte>& bytes = in.logits_tensor.data;
    device_logits = DeviceBuffer(device, bytes.size());
    device_logits.upload(bytes.data(), bytes.size());
    scored_logits.data = device_logits.data();
    if (backward) {
      device_grad = DeviceBuffer(device, grad_t.data.size());
      scored_grad.data = device_grad.data();
    }
  }
  try {
    std::vector<RankScore> ranks =
        score_in_process(req, scored_logits, scored_grad, resolve_threads(o.threads));
    if (backward && device != Device::cpu) {
      device_grad.download(grad_t.data.data(), grad_t.data.size());
    }
    return ranks;
  } catch (const ContractError& e) {
    // What the operator still refuses is about the logits (a non-finite active row).
    throw ContractError(fmt::format("{}: {}", o.logits, e.what()));
  }
}

// The outputs, all or nothing: both temp files are created and written in full, then renamed
// into place together (commit_all), so a failure anywhere (a bad path, a full disk, an I/O
// error on either file) leaves every old file at these paths as it was. Then the summary.
void write_outputs(const LogprobOptions& o, const LogprobInputs& in, const ScoreRequest& req,
                   const RankScore& r0, const io::Tensor& grad_t) {
  std::optional<io::AtomicOutputFile> provenance;
  if (!o.provenance.empty()) provenance.emplace(o.provenance);
  io::AtomicOutputFile tensors_out(o.out);
  std::vector<io::TensorRef> out;
  const std::vector<int64_t> shape1{in.logits.rows};
  auto as_ref = [&](const char* name, const std::vector<float>& v) {
    return io::TensorRef{name, io::TensorDType::F32, shape1, std::as_bytes(std::span(v))};
  };
  out.push_back(as_ref("logp", r0.result.logp));
  out.push_back(as_ref("lse", r0.result.lse));
  if (o.entropy) out.push_back(as_ref("entropy", r0.result.entropy));
  if (wants_backward(req.grads)) out.push_back(grad_t.ref());
  io::Metadata metadata{{"producer", fmt::format("detlogp {}", version())},
                        {"numerics_version", std::string(kNumericsVersion)},
                        {"backend", r0.actual_backend},
                        {"kernel", r0.kernel},
                        {"contract_fingerprint", r0.contract_fingerprint},
                        {"real_vocab", std::to_string(in.real)},
                        {"tp", std::to_string(o.tp)},
                        {"tile_width", std::to_string(req.tile_width)},
                        {"temperature", fmt::format("{}", o.temperature)},
                        {"deterministic", o.deterministic ? "true" : "false"}};
  if (o.softcap) metadata["softcap"] = fmt::format("{}", *o.softcap);
  if (!o.row_temperature.empty()) metadata["row_temperature"] = o.row_temperature;
  if (!o.kept_ids.empty()) metadata["kept_ids"] = o.kept_ids;
  if (o.empty_kept != "error") metadata["empty_kept"] = o.empty_kept;
  if (o.top_k) metadata["top_k"] = fmt::format("{}", *o.top_k);
  if (o.top_p) metadata["top_p"] = fmt::format("{}", *o.top_p);
  io::write_tensors_to(tensors_out, out, metadata);
  std::string names;
  for (const io::TensorRef& t : out) names += (names.empty() ? "" : ", ") + std::string(t.name);
  const std::string summary = fmt::format(
      "wrote {}: {} for {} tokens ({} active) x {} vocab ({} real), {}, TP {}, tile width {}, "
      "backend {} ({})\n",
      o.out, names, in.logits.rows, std::count(in.active.begin(), in.active.end(), true),
      in.logits.cols, in.real, to_string(in.logits.dtype), o.tp, req.tile_width, r0.actual_backend,
      r0.kernel);
  std::vector<io::AtomicOutputFile*> outputs{&tensors_out};
  if (provenance) {
    nlohmann::json j = nlohmann::json::parse(r0.provenance_json);
    j["contract_fingerprint"] = r0.contract_fingerprint;
    const std::string text = j.dump(2) + "\n";
    provenance->write(std::as_bytes(std::span(text)));
    outputs.push_back(&*provenance);
  }
  io::commit_all(outputs);
  std::fputs(summary.c_str(), stdout);
  if (provenance) std::printf("wrote %s\n", o.provenance.c_str());
}

}  // namespace

int logprob_command(const LogprobOptions& o) {
  check_logprob_options(o);
  const Device device = parse_device(o.device);
  init_device(device);
  const LogprobInputs in = read_inputs(o);

  // The TP layout: whole tiles, the first ranks take the extra tiles.
  const int64_t padded = in.logits.cols;
  const int64_t w = resolve_tile_width(o, padded);
  const ScoreRequest req{
      .dtype = in.logits.dtype,
      .real_vocab = in.real,
      .padded_vocab = padded,
      .bounds = even_tile_aligned_bounds(padded, o.tp, w),
      .tile_width = w,
      .temperature = o.temperature,
      .row_temperature = in.row_temperature,
      .kept = {.ids = in.kept_ids,
               .width = in.kept_width,
               .empty_rows =
                   o.empty_kept == "full" ? EmptyKeptRow::full_vocabulary : EmptyKeptRow::error,
               .top_k = in.top_k,
               .top_p = in.top_p},
      .softcap = o.softcap,
      .backend = o.backend,
      .platform = platform_of(device),
      .deterministic = o.deterministic,
      .entropy = o.entropy,
      .targets = in.targets,
      .active = &in.active,
      .grads = {.grad_logp = in.grad_logp,
                .grad_lse = in.grad_lse,
                .grad_entropy = in.grad_entropy},
      .collective_timeout = parse_collective_timeout(o.collective_timeout)};
  // The operator's own rules for the per-token inputs (one temperature per token, each finite
  // and > 0; kept ids in the real vocabulary, once per row, holding each active target),
  // applied before anything is computed, the error naming the file.
  if (!in.row_temperature.empty() || !in.kept_ids.empty() || req.kept.recomputed()) {
    const LogprobContract contract = make_contract(req, 0);
    auto check = [](const std::string& file, auto&& rule) {
      try {
        rule();
      } catch (const ContractError& e) {
        throw ContractError(e.code(), e.field(), fmt::format("{}: {}", file, e.what()));
      }
    };
    check(o.row_temperature,
          [&] { op::check_row_temperature(in.row_temperature, in.logits.rows, contract); });
    check("--top-k/--top-p", [&] { op::check_recomputed_kept(req.kept, in.logits.rows); });
    if (req.kept.given()) {
      check(o.kept_ids,
            [&] { op::check_kept_ids(req.kept, in.logits.rows, in.targets, contract); });
    }
  }
  const bool backward = wants_backward(req.grads);
  const std::size_t grad_bytes = in.logits_tensor.data.size();
  if (backward) {
    io::require_memory(grad_bytes,
                       fmt::format("the gradient of {} ({} x {} of {})", o.logits, in.logits.rows,
                                   padded, to_string(in.logits.dtype)),
                       "use a file with fewer tokens, or no --grad-* options (no gradient)");
  }
  io::Tensor grad_t{
      .name = "grad_logits",
      .dtype = in.logits_tensor.dtype,
      .shape = {in.logits.rows, padded},
      .data = io::allocate_bytes(backward ? grad_bytes : 0, "allocating the logits gradient")};
  const std::vector<RankScore> ranks = score(o, req, in, grad_t, device);
  write_outputs(o, in, req, ranks[0], grad_t);
  return kExitOk;
}

}  // namespace detlogp::cli
