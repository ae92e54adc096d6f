// `detlogp bench`: in one run, on one synthetic batch (TP = 1, the calling process):
//   canonical_forward / canonical_forward_entropy / canonical_backward: the registry's canonical
//     CPU backend (cpu-canonical-vocab-parallel-logp, SIMD kernels), deterministic mode;
//   nondeterministic_forward: the same backend in the fixed-topology mode (ForwardOptions
//     deterministic=false: one left fold per shard instead of the canonical tree);
//   naive_forward: a straightforward non-tiled two-pass row loop (fp32 max, then fp32 sum of
//     std::exp(z - max), a log), multithreaded over rows with the same thread count;
// plus the machine's read bandwidth (a multithreaded sum over the logits buffer), measured in
// the same run. floor_fraction = bytes moved / read bandwidth / seconds: 1.0 is as fast as
// reading the logits (backward also writes the gradient, counted as bytes moved).
//
// --device cuda: the same canonical and nondeterministic benchmarks on the registry's cuda
// backend (cuda-canonical-vocab-parallel-logp, logits and gradient in GPU memory), against the
// device-to-device copy bandwidth measured in the same run (bytes read + written per second);
// naive_forward (a CPU loop) is left out.

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli.hpp"
#include "device.hpp"
#include "memory/memory.hpp"
#include "numerics/element_io.hpp"
#include "parallel.hpp"
#include "progress.hpp"
#include "scoring.hpp"
#include "synthetic.hpp"
#include "table.hpp"

namespace detlogp::cli {
namespace {

double median_seconds(int repeats, const std::function<void()>& fn) {
  fn();  // warm-up (page faults, caches, thread start-up)
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  const std::size_t n = t.size();
  return n % 2 == 1 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

// Sums the buffer as 64-bit words on `threads` threads; returns GB/s (1e9 bytes).
double read_gbps(const std::vector<std::byte>& buf, int threads, int repeats) {
  const int64_t words = static_cast<int64_t>(buf.size() / 8);
  std::atomic<uint64_t> sink{0};
  const double s = median_seconds(repeats, [&] {
    parallel_for(words, threads, [&](int64_t a, int64_t b) {
      uint64_t acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0;
      int64_t i = a;
      for (; i + 4 <= b; i += 4) {
        uint64_t w[4];
        std::memcpy(w, buf.data() + i * 8, 32);
        acc0 += w[0];
        acc1 += w[1];
        acc2 += w[2];
        acc3 += w[3];
      }
      for (; i < b; ++i) {
        uint64_t w;
        std::memcpy(&w, buf.data() + i * 8, 8);
        acc0 += w;
      }
      sink.fetch_add(acc0 + acc1 + acc2 + acc3, std::memory_order_relaxed);
    });
  });
  return static_cast<double>(words * 8) / s / 1e9;
}

float load(DType dtype, const std::byte* row, int64_t c) {
  return numerics::load_as_float(row, dtype, c);
}

// The straightforward baseline: per row, pass 1 the max, pass 2 the sum of exp(z - max).
void naive_forward(const LogitsView& x, std::span<const int64_t> targets,
                   const std::vector<bool>& active, std::span<float> logp, std::span<float> lse,
                   int threads) {
  const std::size_t esz = dtype_size(x.dtype);
  parallel_for(x.rows, threads, [&](int64_t a, int64_t b) {
    for (int64_t r = a; r < b; ++r) {
      const auto* row = static_cast<const std::byte*>(x.data) + r * x.row_stride * esz;
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < x.cols; ++c) m = std::max(m, load(x.dtype, row, c));
      float s = 0.0f;
      for (int64_t c = 0; c < x.cols; ++c) s += std::exp(load(x.dtype, row, c) - m);
      lse[r] = m + std::log(s);
      logp[r] = active[r] ? load(x.dtype, row, targets[r]) - lse[r] : 0.0f;
    }
  });
}

struct Result {
  std::string name;
  double seconds = 0;
  double bytes = 0;
};

// What one bench run measured, for the report.
struct BenchReport {
  BenchOptions options;
  Device device = Device::cpu;
  std::string backend_id, kernel;
  int threads = 1;
  int64_t vocab = 0;          // padded vocabulary (TP 1)
  double bandwidth_gbps = 0;  // cpu: read bandwidth; cuda: D2D copy bandwidth (read + write)
  std::vector<Result> results;
};

// The report: --json one object, else the table.
void print_bench_report(const BenchReport& r) {
  const BenchOptions& o = r.options;
  const bool on_cpu = r.device == Device::cpu;
  const int64_t n = o.tokens, v = r.vocab;
  const int threads = r.threads;
  const double gbps = r.bandwidth_gbps;
  const double elements = static_cast<double>(n * v);
  if (o.json) {
    nlohmann::json j;
    if (on_cpu) {
      j["machine"] = {{"read_gbps", gbps},
                      {"threads", threads},
                      {"hardware_threads", std::thread::hardware_concurrency()},
                      {"kernel", r.kernel},
                      {"simd_targets", simd_targets()}};
    } else {
      j["machine"] = {{"device", device_description(r.device)},
                      {"d2d_copy_gbps", gbps},
                      {"kernel", r.kernel},
                      {"backend", r.backend_id}};
    }
    j["results"] = nlohmann::json::array();
    for (const Result& x : r.results) {
      j["results"].push_back({{"name", x.name},
                              {"dtype", o.dtype},
                              {"tokens", n},
                              {"vocab", v},
                              {"threads", threads},
                              {"repeats", o.repeats},
                              {"seconds_median", x.seconds},
                              {"elements_per_second", elements / x.seconds},
                              {"floor_fraction", x.bytes / (gbps * 1e9) / x.seconds}});
    }
    std::cout << j.dump(2) << "\n";
    return;
  }
  if (on_cpu) {
    std::cout << fmt::format(
        "detlogp bench: {} tokens x {} vocab, {}, {} thread{}, kernel {}, median of {}\n", n, v,
        o.dtype, threads, threads == 1 ? "" : "s", r.kernel, o.repeats);
    std::cout << fmt::format("read bandwidth: {:.2f} GB/s\n\n", gbps);
  } else {
    std::cout << fmt::format(
        "detlogp bench: {} tokens x {} vocab, {}, device {}, backend {} (kernel {}), median of "
        "{}\n",
        n, v, o.dtype, device_description(r.device), r.backend_id, r.kernel, o.repeats);
    std::cout << fmt::format("D2D copy bandwidth: {:.2f} GB/s (read + write)\n\n", gbps);
  }
  Table t({"name", "median", "elements/s", "floor fraction", "vs naive"});
  double naive = 0;
  for (const Result& x : r.results) {
    if (x.name == "naive_forward") naive = x.seconds;
  }
  for (const Result& x : r.results) {
    t.add_row({x.name, fmt_seconds(x.seconds), fmt_rate(elements / x.seconds),
               fmt::format("{:.2f}", x.bytes / (gbps * 1e9) / x.seconds),
               naive > 0 ? fmt::format("{:.2f}x", naive / x.seconds) : std::string("-")});
  }
  std::cout << t.str();
  if (on_cpu) {
    std::cout << "floor fraction: bytes moved / read bandwidth / time (1.00 = as fast as reading "
                 "the logits once; backward counts the gradient write)\n";
  } else {
    std::cout << "floor fraction: bytes moved / D2D copy bandwidth / time (1.00 = as fast as "
                 "copying; backward counts the gradient write)\n";
  }
}

}  // namespace

int bench_command(const BenchOptions& o) {
  if (o.tokens <= 0) throw UsageError(fmt::format("--tokens must be > 0; got {}", o.tokens));
  if (o.real_vocab <= 0) {
    throw UsageError(fmt::format("--real-vocab must be > 0; got {}", o.real_vocab));
  }
  if (o.repeats < 1) throw UsageError(fmt::format("--repeats must be >= 1; got {}", o.repeats));
  if (o.threads < 0) throw UsageError(fmt::format("--threads must be >= 0; got {}", o.threads));
  const DType dtype = parse_dtype(o.dtype, "--dtype");
  const Device device = parse_device(o.device);
  const bool on_cpu = device == Device::cpu;
  init_device(device);
  const std::string backend_id = canonical_backend_id(device);
  const int threads = resolve_threads(o.threads);
  const int64_t n = o.tokens;
  const int64_t v = megatron_padded_vocab(o.real_vocab, 1);
  const std::size_t esz = dtype_size(dtype);
  const SyntheticSpec spec{
      .tokens = n, .real_vocab = o.real_vocab, .dtype = dtype, .key = o.batch_key};

  Progress progress(true);
  progress.step("[bench] generating synthetic logits...");
  // Logits and gradient, each tokens x padded: refuse up front what this process cannot hold.
  const std::uint64_t bytes_each =
      io::checked_product({static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(v), esz},
                          "--tokens x vocabulary x dtype size");
  io::require_memory(
      io::checked_product({2, bytes_each}, "the logits and the gradient"),
      fmt::format("--tokens {} x {} columns of {} (the logits and the gradient)", n, v, o.dtype),
      "use fewer --tokens");
  std::vector<std::byte> logits =
      io::allocate_bytes(static_cast<std::size_t>(bytes_each), "[bench] allocating the logits");
  std::vector<std::byte> grad =
      io::allocate_bytes(static_cast<std::size_t>(bytes_each), "[bench] allocating the gradient");
  fill_logits(spec, 0, n, 0, v, logits.data(), v, threads);
  const SyntheticRows rows = synthetic_rows(spec, 0, n);
  DeviceBuffer device_logits, device_grad;
  if (!on_cpu) {
    progress.step("[bench] copying the logits to " + device_description(device) + "...");
    device_logits = DeviceBuffer(device, logits.size());
    device_grad = DeviceBuffer(device, grad.size());
    device_logits.upload(logits.data(), logits.size());
  }
  const LogitsView x{
      .data = on_cpu ? static_cast<const void*>(logits.data()) : device_logits.data(),
      .dtype = dtype,
      .rows = n,
      .cols = v,
      .row_stride = v};
  const MutableLogitsView g{.data = on_cpu ? static_cast<void*>(grad.data()) : device_grad.data(),
                            .dtype = dtype,
                            .rows = n,
                            .cols = v,
                            .row_stride = v};

  double gbps = 0;
  if (on_cpu) {
    progress.step("[bench] read bandwidth...");
    gbps = read_gbps(logits, threads, o.repeats);
  } else {
    // Device-to-device copy of the logits: bytes read + bytes written per second.
    progress.step("[bench] D2D copy bandwidth...");
    const double s =
        median_seconds(o.repeats, [&] { device_grad.copy_from(device_logits, logits.size()); });
    gbps = 2.0 * static_cast<double>(logits.size()) / s / 1e9;
  }

  ScoreRequest req{.dtype = dtype,
                   .real_vocab = o.real_vocab,
                   .padded_vocab = v,
                   .bounds = {{0, v}},
                   .backend = backend_id,
                   .platform = platform_of(device),
                   .targets = rows.targets,
                   .active = &rows.active};
  const LogprobContract det = make_contract(req, 0);
  req.deterministic = false;
  const LogprobContract nondet = make_contract(req, 0);
  const DispatchResult d = Registry::global().get_logprob_op(det, backend_id, req.platform);
  const DispatchResult dn = Registry::global().get_logprob_op(nondet, backend_id, req.platform);
  SelfComm self;
  const ExecOptions exec{.threads = threads};
  const double read_bytes = static_cast<double>(n * v) * static_cast<double>(esz);

  std::vector<Result> results;
  auto forward = [&](const DispatchResult& dr, const LogprobContract& c, bool deterministic,
                     bool entropy) {
    return dr.op->forward(x, rows.targets, c, self,
                          {.deterministic = deterministic, .entropy = entropy, .exec = exec});
  };
  progress.step("[bench] canonical_forward...");
  results.push_back({"canonical_forward",
                     median_seconds(o.repeats, [&] { forward(d, det, true, false); }), read_bytes});
  progress.step("[bench] canonical_forward_entropy...");
  results.push_back({"canonical_forward_entropy",
                     median_seconds(o.repeats, [&] { forward(d, det, true, true); }), read_bytes});
  progress.step("[bench] canonical_backward...");
  const LogprobResult fwd = forward(d, det, true, true);
  const LogprobGrads grads{
      .grad_logp = rows.grad_logp, .grad_lse = rows.grad_lse, .grad_entropy = rows.grad_entropy};
  results.push_back({"canonical_backward",
                     median_seconds(o.repeats, [&] { d.op->backward(fwd, grads, g); }),
                     2 * read_bytes});
  if (on_cpu) {
    progress.step("[bench] naive_forward...");
    std::vector<float> logp(static_cast<std::size_t>(n)), lse(logp.size());
    results.push_back(
        {"naive_forward",
         median_seconds(o.repeats,
                        [&] { naive_forward(x, rows.targets, rows.active, logp, lse, threads); }),
         read_bytes});
  }
  progress.step("[bench] nondeterministic_forward...");
  results.push_back({"nondeterministic_forward",
                     median_seconds(o.repeats, [&] { forward(dn, nondet, false, false); }),
                     read_bytes});
  progress.clear();

  progress.clear();
  print_bench_report({.options = o,
                      .device = device,
                      .backend_id = backend_id,
                      .kernel = d.op->kernel_name(),
                      .threads = threads,
                      .vocab = v,
                      .bandwidth_gbps = gbps,
                      .results = results});
  return kExitOk;
}

}  // namespace detlogp::cli
