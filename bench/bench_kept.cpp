// What sampling-replay kept sets cost over plain logp (docs/benchmarks.md "Kept sets"): the
// logits operator from the registry (as callers get it) on one TP shard's worth of columns
// (the shard as its own vocabulary), bf16 logits N(0, 8^2), forward with entropy then backward
// (grad_logp and grad_entropy), plain and with kept sets of K random ids per row (the target
// among them), the runs interleaved in one process (A/B) and timed as the minimum thread CPU
// time on one thread, so that a loaded machine slows each side alike. Two shapes: Qwen3
// (151936 / TP 4) and Gemma (262144 / TP 4, softcap 30); K = 64 and 512.
//
//   bench_kept [--rows 256] [--reps 7]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench_clock.hpp"
#include "detlogp/detlogp.hpp"
#include "numerics/canon.hpp"

namespace {

using namespace detlogp;

struct Shape {
  const char* name;
  int64_t vocab;  // one TP rank's columns
  std::optional<float> softcap;
};

// The best forward and backward thread CPU seconds of one configuration.
struct Best {
  double fwd = 1e30, bwd = 1e30;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 256;
  int reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rows") rows = std::atoll(argv[i + 1]);
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
  }
  const Shape shapes[] = {{"Qwen3 151936 / TP 4", 151936 / 4, std::nullopt},
                          {"Gemma 262144 / TP 4, softcap 30", 262144 / 4, 30.0f}};
  const int64_t ks[] = {64, 512};
  std::printf(
      "bench_kept: bf16, %lld rows, 1 thread, forward with entropy and backward, min thread "
      "CPU time of %d runs, plain and kept sets interleaved (A/B)\n",
      static_cast<long long>(rows), reps);
  std::printf("%-34s %5s %10s %10s %7s %10s %10s %7s\n", "shape", "K", "fwd ms", "kept ms", "ratio",
              "bwd ms", "kept ms", "ratio");
  SelfComm self;
  for (const Shape& shape : shapes) {
    const VocabLayout layout = megatron_bounds(shape.vocab, 1);
    const int64_t cols = layout.padded_vocab_size;
    std::vector<uint16_t> data(static_cast<size_t>(rows * cols));
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal(0.0f, 8.0f);
    for (auto& h : data) h = canon::float_to_bf16(normal(rng));
    std::vector<int64_t> targets(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) targets[i] = (i * 7919) % shape.vocab;
    const LogprobContract contract(
        {.role = Role::train,
         .dtype = DType::bf16,
         .mask = MaskSpec::all_active(rows),
         .sharding = ShardingSpec({.tp_rank = 0,
                                   .tp_world_size = 1,
                                   .vocab_shard_bounds = layout.vocab_shard_bounds,
                                   .real_vocab_size = shape.vocab,
                                   .padded_vocab_size = cols}),
         .softcap = shape.softcap});
    const DispatchResult d = get_logprob_op(contract, "production");
    const LogitsView view{data.data(), DType::bf16, rows, cols, cols};
    std::vector<uint16_t> grad(data.size());
    const MutableLogitsView gview{grad.data(), DType::bf16, rows, cols, cols};
    std::vector<float> g(static_cast<size_t>(rows), 0.5f);
    // One forward and backward; kept: empty for plain.
    auto run = [&](const std::vector<int64_t>& kept, int64_t k, Best& best) {
      const ForwardOptions opt{.entropy = true,
                               .exec = {.threads = 1},
                               .kept = {.ids = kept, .width = kept.empty() ? 0 : k}};
      double t0 = thread_cpu_seconds();
      LogprobResult out = d.op->forward(view, targets, contract, self, opt);
      const double f = thread_cpu_seconds() - t0;
      t0 = thread_cpu_seconds();
      d.op->backward(out, {.grad_logp = g, .grad_entropy = g}, gview);
      const double b = thread_cpu_seconds() - t0;
      best.fwd = std::min(best.fwd, f);
      best.bwd = std::min(best.bwd, b);
    };
    for (const int64_t k : ks) {
      // K distinct random ids per row, the target first.
      std::vector<int64_t> kept(static_cast<size_t>(rows * k));
      for (int64_t i = 0; i < rows; ++i) {
        std::vector<int64_t> row{targets[static_cast<size_t>(i)]};
        std::uniform_int_distribution<int64_t> pick(0, shape.vocab - 1);
        while (static_cast<int64_t>(row.size()) < k) {
          const int64_t id = pick(rng);
          if (std::find(row.begin(), row.end(), id) == row.end()) row.push_back(id);
        }
        std::copy(row.begin(), row.end(), kept.begin() + i * k);
      }
      Best plain, with_kept, warm;
      run({}, 0, warm);  // warm-up
      run(kept, k, warm);
      for (int rep = 0; rep < reps; ++rep) {
        run({}, 0, plain);
        run(kept, k, with_kept);
      }
      std::printf("%-34s %5lld %10.2f %10.2f %7.3f %10.2f %10.2f %7.3f\n", shape.name,
                  static_cast<long long>(k), 1e3 * plain.fwd, 1e3 * with_kept.fwd,
                  with_kept.fwd / plain.fwd, 1e3 * plain.bwd, 1e3 * with_kept.bwd,
                  with_kept.bwd / plain.bwd);
    }
  }
  return 0;
}
