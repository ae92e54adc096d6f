// Benchmark of the shard-local kernels (docs/benchmarks.md): forward (logp + LSE), forward with
// entropy and backward, SIMD and scalar reference, bf16 and fp32, plus the machine's read
// bandwidth measured in the same run. Plain timing harness: each case runs `reps` times after
// a warm-up and reports the median. Output: a table on stdout and one JSON object per line in
// --json (read by bench/summarize.py together with bench/torch_bench.py's results).
//
//   bench_kernels [--rows 1024] [--threads 2] [--reps 5] [--ref-rows 16] [--json out.jsonl]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_clock.hpp"
#include "detlogp/dtype.hpp"
#include "detlogp/kernels.hpp"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kRealVocab = 151936;
constexpr int64_t kPadded = 152064;
constexpr int64_t kTileWidth = 128;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median_seconds(int reps, const std::function<void()>& fn) {
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Compute cost on one core, robust to other processes sharing the machine: the minimum thread
// CPU time of `reps` runs on the calling thread (threads = 1) over a few cache-resident rows.
double min_cpu_seconds(int reps, const std::function<void()>& fn) {
  fn();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = thread_cpu_seconds();
    fn();
    best = std::min(best, thread_cpu_seconds() - t0);
  }
  return best;
}

// Read bandwidth: `threads` threads each summing their half of a 1 GiB buffer (64-bit words,
// 8 independent accumulators), median of several passes.
double read_bandwidth(int threads, int reps) {
  const size_t bytes = size_t{1} << 30;
  const size_t words = bytes / 8;
  std::vector<uint64_t> buf(words);
  for (size_t i = 0; i < words; ++i) buf[i] = i * 0x9e3779b97f4a7c15ull;
  std::atomic<uint64_t> sink{0};
  auto pass = [&] {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const size_t b = words * t / threads, e = words * (t + 1) / threads;
        uint64_t a[8] = {};
        size_t i = b;
        for (; i + 8 <= e; i += 8) {
          for (int k = 0; k < 8; ++k) a[k] += buf[i + k];
        }
        for (; i < e; ++i) a[0] += buf[i];
        uint64_t s = 0;
        for (uint64_t v : a) s += v;
        sink += s;
      });
    }
    for (auto& th : pool) th.join();
  };
  const double sec = median_seconds(reps, pass);
  return static_cast<double>(bytes) / sec;
}

struct Logits {
  detlogp::DType dtype;
  int64_t rows;
  std::vector<uint8_t> bytes;
  detlogp::LogitsView view() const {
    return detlogp::LogitsView{bytes.data(), dtype, rows, kPadded, kPadded};
  }
};

Logits make_logits(detlogp::DType dtype, int64_t rows, uint64_t stream) {
  Logits l{dtype, rows, {}};
  const size_t n = static_cast<size_t>(rows * kPadded);
  l.bytes.resize(n * detlogp::dtype_size(dtype));
  std::mt19937_64 rng(stream);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (size_t i = 0; i < n; ++i) {
    const float v = normal(rng);
    if (dtype == detlogp::DType::fp32) {
      std::memcpy(l.bytes.data() + i * 4, &v, 4);
    } else {
      const uint16_t h = detlogp::float_to_bf16(v);
      std::memcpy(l.bytes.data() + i * 2, &h, 2);
    }
  }
  return l;
}

struct Result {
  std::string impl, op, dtype;
  int64_t rows;
  double seconds;
  double elements_per_s;
  double floor_fraction;  // time to move the bytes once at the read bandwidth / time taken
};

// The whole forward of one shard at TP=1: node partials of the cover of [0, T), the root, the
// target logits and logp.
struct Forward {
  const detlogp::ShardKernels& k;
  const Logits& l;
  detlogp::ShardSpec spec;
  std::vector<detlogp::TreeNode> cover;
  std::vector<detlogp::NodePartial> partials;
  std::vector<float> lse, entropy, target_z, logp;
  std::vector<int64_t> target;
  detlogp::ExecOptions exec;

  Forward(const detlogp::ShardKernels& kernels, const Logits& logits, int threads)
      : k(kernels), l(logits) {
    spec.geometry = detlogp::TileGeometry{kRealVocab, kTileWidth};
    cover = detlogp::canonical_cover(spec.geometry, 0, kPadded / kTileWidth);
    partials.resize(static_cast<size_t>(l.rows) * cover.size());
    lse.resize(static_cast<size_t>(l.rows));
    entropy.resize(lse.size());
    target_z.resize(lse.size());
    logp.resize(lse.size());
    target.resize(lse.size());
    for (size_t r = 0; r < target.size(); ++r)
      target[r] = static_cast<int64_t>((r * 7919) % kRealVocab);
    exec.threads = threads;
  }

  void run(bool with_entropy) {
    k.node_partials(l.view(), spec, cover, with_entropy, partials, exec);
    k.merge_roots(
        spec.geometry, cover, partials, l.rows,
        detlogp::RootsOut{lse, with_entropy ? std::span<float>(entropy) : std::span<float>()},
        exec);
    detlogp::read_target_logits(l.view(), spec, target, target_z);
    for (size_t r = 0; r < logp.size(); ++r) logp[r] = target_z[r] - lse[r];
  }

  void backward(std::vector<uint8_t>& grad, const std::vector<float>& g) {
    detlogp::BackwardInputs in;
    in.lse = lse;
    in.entropy = entropy;
    in.target_local = target;
    in.grad_logp = g;
    in.grad_lse = g;
    in.grad_entropy = g;
    detlogp::MutableLogitsView gv{grad.data(), l.dtype, l.rows, kPadded, kPadded};
    k.backward(l.view(), spec, in, gv, exec);
  }
};

const char* dtype_name(detlogp::DType d) {
  return d == detlogp::DType::fp32 ? "fp32" : (d == detlogp::DType::bf16 ? "bf16" : "fp16");
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 1024, ref_rows = 16;
  int threads = 2, reps = 5;
  std::string json_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rows")
      rows = std::atoll(argv[i + 1]);
    else if (a == "--ref-rows")
      ref_rows = std::atoll(argv[i + 1]);
    else if (a == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (a == "--json")
      json_path = argv[i + 1];
  }
  std::printf(
      "detlogp kernel benchmark: rows %lld, real vocab %lld, padded %lld, W %lld, %d "
      "threads, median of %d\n",
      static_cast<long long>(rows), static_cast<long long>(kRealVocab),
      static_cast<long long>(kPadded), static_cast<long long>(kTileWidth), threads, reps);
  const double bw = read_bandwidth(threads, reps);
  std::printf("read bandwidth (%d threads, 1 GiB sum): %.2f GB/s\n", threads, bw / 1e9);
  std::printf("SIMD target: %s\n", detlogp::simd_kernels().name().c_str());

  std::vector<Result> results;
  auto record = [&](const std::string& impl, const std::string& op, detlogp::DType dt,
                    int64_t n_rows, double sec) {
    const double elems = static_cast<double>(n_rows) * kPadded;
    const double bytes_moved =
        elems * static_cast<double>(detlogp::dtype_size(dt)) * (op == "backward" ? 2.0 : 1.0);
    const double floor_s = bytes_moved / bw;
    results.push_back(Result{impl, op, dtype_name(dt), n_rows, sec, elems / sec, floor_s / sec});
    const Result& r = results.back();
    std::printf("%-10s %-16s %-5s rows %5lld  %9.2f ms  %6.2f G elem/s  %5.1f%% of floor\n",
                r.impl.c_str(), r.op.c_str(), r.dtype.c_str(), static_cast<long long>(n_rows),
                sec * 1e3, r.elements_per_s / 1e9, 100.0 * r.floor_fraction);
    std::fflush(stdout);
  };

  for (detlogp::DType dt : {detlogp::DType::bf16, detlogp::DType::fp32}) {
    {
      const Logits l = make_logits(dt, rows, 1);
      Forward f(detlogp::simd_kernels(), l, threads);
      record("simd", "forward", dt, rows, median_seconds(reps, [&] { f.run(false); }));
      record("simd", "forward+entropy", dt, rows, median_seconds(reps, [&] { f.run(true); }));
      std::vector<uint8_t> grad(l.bytes.size());
      const std::vector<float> g(static_cast<size_t>(rows), 0.5f);
      record("simd", "backward", dt, rows, median_seconds(reps, [&] { f.backward(grad, g); }));
    }
    {
      const Logits l = make_logits(dt, ref_rows, 2);
      Forward f(detlogp::reference_kernels(), l, 1);
      record("reference", "forward", dt, ref_rows, median_seconds(3, [&] { f.run(false); }));
      record("reference", "forward+entropy", dt, ref_rows, median_seconds(3, [&] { f.run(true); }));
      std::vector<uint8_t> grad(l.bytes.size());
      const std::vector<float> g(static_cast<size_t>(ref_rows), 0.5f);
      record("reference", "backward", dt, ref_rows,
             median_seconds(3, [&] { f.backward(grad, g); }));
    }
  }

  // Per-core compute cost (CPU time, 1 thread, 8 rows = 1.2-2.4 MB resident in L2/L3).
  std::printf("per-core compute (thread CPU time, 1 thread, 8 cache-resident rows):\n");
  for (detlogp::DType dt : {detlogp::DType::bf16, detlogp::DType::fp32}) {
    const int64_t hot_rows = 8;
    const Logits l = make_logits(dt, hot_rows, 3);
    Forward f(detlogp::simd_kernels(), l, 1);
    std::vector<uint8_t> grad(l.bytes.size());
    const std::vector<float> g(static_cast<size_t>(hot_rows), 0.5f);
    const double elems = static_cast<double>(hot_rows) * kPadded;
    const double fwd = min_cpu_seconds(20, [&] { f.run(false); });
    const double ent = min_cpu_seconds(20, [&] { f.run(true); });
    const double bwd = min_cpu_seconds(20, [&] { f.backward(grad, g); });
    std::printf(
        "  %s: forward %.3f ns/elem (%.2f G elem/s/core), +entropy %.3f ns/elem (+%.1f%%), "
        "backward %.3f ns/elem (%.2f G elem/s/core)\n",
        dtype_name(dt), fwd * 1e9 / elems, elems / fwd / 1e9, ent * 1e9 / elems,
        100.0 * (ent / fwd - 1.0), bwd * 1e9 / elems, elems / bwd / 1e9);
  }

  if (!json_path.empty()) {
    FILE* out = std::fopen(json_path.c_str(), "w");
    if (out == nullptr) {
      std::perror(json_path.c_str());
      return 1;
    }
    std::fprintf(out, "{\"kind\": \"bandwidth\", \"bytes_per_s\": %.6e, \"threads\": %d}\n", bw,
                 threads);
    for (const Result& r : results) {
      std::fprintf(out,
                   "{\"kind\": \"kernel\", \"impl\": \"%s\", \"op\": \"%s\", \"dtype\": \"%s\", "
                   "\"rows\": %lld, \"cols\": %lld, \"seconds\": %.6e, \"elements_per_s\": %.6e, "
                   "\"floor_fraction\": %.4f}\n",
                   r.impl.c_str(), r.op.c_str(), r.dtype.c_str(), static_cast<long long>(r.rows),
                   static_cast<long long>(kPadded), r.seconds, r.elements_per_s, r.floor_fraction);
    }
    std::fclose(out);
  }
  return 0;
}
