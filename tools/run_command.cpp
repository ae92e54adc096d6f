// `detlogp run`: the README's main job. A keyed synthetic Qwen3-shaped batch through the
// registry at every requested TP degree on the in-process rank group (forward with entropy,
// backward with all three gradients), checked bitwise across TP degrees and against a float64
// reference. The op kind and the transport pick the path: --fused goes to
// fused_run_command.cpp, `mpirun ... detlogp run --comm mpi` to run_mpi.cpp; all of them share
// the scenario, scoring and report code.

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "cli.hpp"
#include "device.hpp"
#include "memory/memory.hpp"
#include "progress.hpp"
#include "run_checks.hpp"
#include "run_report.hpp"
#include "run_scenario.hpp"
#include "scoring.hpp"
#include "synthetic.hpp"

namespace detlogp::cli {
namespace {

// "auto": mpi when launched by mpirun/srun with MPI built in, else in-process.
std::string resolve_comm(const std::string& comm) {
  if (comm == "in-process" || comm == "mpi") return comm;
  if (comm != "auto") {
    throw UsageError("--comm must be one of: auto, in-process, mpi; got '" + comm + "'");
  }
#ifdef DETLOGP_CLI_WITH_MPI
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(var) != nullptr) return "mpi";
  }
#endif
  return "in-process";
}

}  // namespace

int run_command(const RunOptions& o, int* argc, char*** argv) {
  if (o.fused) return fused_run_command(o);  // the op kind first: --fused has its own checks
  const std::string comm = resolve_comm(o.comm);
  check_run_options(o);
  const Device device = parse_device(o.device);
  if (comm == "mpi" && device != Device::cpu) {
    throw UsageError(
        "--device cuda runs on the in-process group (all TP ranks on one GPU); "
        "it does not combine with --comm mpi");
  }
  if (comm == "mpi") {
#ifdef DETLOGP_CLI_WITH_MPI
    return run_mpi_command(o, argc, argv);
#else
    (void)argc;
    (void)argv;
    throw UsageError("--comm mpi: this detlogp was built without MPI (DETLOGP_WITH_MPI=OFF)");
#endif
  }
  const RunScenario s = in_process_scenario(o);
  init_device(device);
  const int64_t stride = s.widest_padded;  // one buffer for every TP degree's padding
  // Logits and gradient, each tokens x padded: refuse up front what this process cannot hold
  // (instead of a bare std::bad_alloc, or the kernel's OOM killer, halfway through).
  const RunBuffer buffers[] = {{.name = "the logits and the gradient",
                                .count = 2,
                                .rows = static_cast<std::uint64_t>(o.tokens),
                                .cols = static_cast<std::uint64_t>(stride),
                                .element_size = dtype_size(s.dtype)}};
  const std::size_t bytes =
      require_run_memory(buffers,
                         fmt::format("--tokens {} x {} columns of {}", o.tokens, stride, o.dtype),
                         "use fewer --tokens") /
      2;

  Progress progress(true);
  progress.step("[run] generating synthetic logits...");
  std::vector<std::byte> logits = io::allocate_bytes(bytes, "[run] allocating the logits");
  std::vector<std::byte> grad = io::allocate_bytes(bytes, "[run] allocating the gradient");
  fill_logits(s.spec, 0, o.tokens, 0, stride, logits.data(), stride, s.threads);
  const SyntheticRows rows = synthetic_rows(s.spec, 0, o.tokens);
  // The buffers the ranks read and write: the host's for cpu; for cuda one device copy of the
  // logits (each rank's shard is its column range of it) and a device gradient, copied back
  // into `grad` for the checks.
  DeviceBuffer device_logits, device_grad;
  if (device != Device::cpu) {
    progress.step("[run] copying the logits to " + device_description(device) + "...");
    device_logits = DeviceBuffer(device, bytes);
    device_grad = DeviceBuffer(device, bytes);
    device_logits.upload(logits.data(), bytes);
  }
  const void* logits_data = device != Device::cpu ? device_logits.data() : logits.data();
  void* grad_data = device != Device::cpu ? device_grad.data() : grad.data();

  RunReport report = start_run_report(o, "in-process", s.threads, rows);
  report.device = device_description(device);
  for (const VocabLayout& layout : s.layouts) {
    const std::string tag = fmt::format("[tp {}] ", layout.vocab_shard_bounds.size());
    ScoreRequest req = run_request(o, s, layout, rows);
    req.platform = platform_of(device);
    req.on_phase = [&](const std::string& p) { progress.step(tag + p + "..."); };
    // Garbage (all bits set: NaN) so that a column backward does not write shows.
    std::memset(grad.data(), 0xff, grad.size());
    if (device != Device::cpu) device_grad.fill(0xff);
    const int64_t padded = layout.padded_vocab_size;
    const std::vector<RankScore> ranks = score_in_process(
        req, LogitsView{logits_data, s.dtype, o.tokens, padded, stride},
        MutableLogitsView{grad_data, s.dtype, o.tokens, padded, stride}, s.threads);
    if (device != Device::cpu) device_grad.download(grad.data(), grad.size());
    progress.step(tag + "checking...");
    const LogitsView grad_read{grad.data(), s.dtype, o.tokens, padded, stride};
    const LogprobResult& res = ranks[0].result;
    TpRunReport r =
        judge_tp_run(o, s.spec, rows, ranks[0], layout,
                     {.logp = res.logp, .lse = res.lse, .entropy = res.entropy, .grad = grad_read});
    for (const RankScore& rank : ranks) {
      r.forward_seconds = std::max(r.forward_seconds, rank.forward_seconds);
      r.backward_seconds = std::max(r.backward_seconds, rank.backward_seconds);
    }
    r.replicated = outputs_replicated(ranks);
    r.padding_grad_zero = padding_is_zero(grad_read, o.real_vocab);
    r.bitwise_equal = report.runs.empty() || r.digests == report.runs.front().digests;
    report.runs.push_back(std::move(r));
  }
  progress.clear();
  return print_run_report(report);
}

}  // namespace detlogp::cli
