// What detlogp::sample costs against the trainer's plain forward on the same logits
// (docs/benchmarks.md "Sampling"): one rank holding a Qwen-sized vocabulary (151936 columns,
// bf16), a few dozen rows, one thread; interleaved in one run (A/B: a loaded machine slows all
// alike). Cases: the plain forward; sample() over the full vocabulary at temperature 1 with
// logits of scale 5 (the scan skips ids whose key cannot win) and of scale 0.5 (flat rows:
// nearly every id's key is computed); with top_k = 50; greedy. Reports the minimum thread CPU
// time and the ratio to the forward.
//
//   bench_sample [--rows 32] [--reps 5]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench_clock.hpp"
#include "detlogp/detlogp.hpp"

namespace {

constexpr int64_t kVocab = 151936;

detlogp::LogprobContract contract_of(int64_t rows) {
  using namespace detlogp;
  return LogprobContract({.role = Role::train,
                          .dtype = DType::bf16,
                          .mask = MaskSpec::all_active(rows, -100),
                          .sharding = ShardingSpec({.tp_rank = 0,
                                                    .tp_world_size = 1,
                                                    .vocab_shard_bounds = {{0, kVocab}},
                                                    .real_vocab_size = kVocab,
                                                    .padded_vocab_size = kVocab})});
}

std::vector<uint16_t> logits_of(int64_t rows, float scale) {
  std::vector<uint16_t> data(static_cast<size_t>(rows * kVocab));
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, scale);
  for (auto& h : data) h = detlogp::float_to_bf16(normal(rng));
  return data;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 32;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rows") rows = std::atoll(argv[i + 1]);
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
  }
  const detlogp::VocabParallelLogprob op(detlogp::simd_kernels(), "bench");
  const detlogp::LogprobContract c = contract_of(rows);
  const std::vector<uint16_t> sharp = logits_of(rows, 5.0f), flat = logits_of(rows, 0.5f);
  const detlogp::LogitsView sharp_view{sharp.data(), detlogp::DType::bf16, rows, kVocab, kVocab};
  const detlogp::LogitsView flat_view{flat.data(), detlogp::DType::bf16, rows, kVocab, kVocab};
  std::vector<int64_t> targets(static_cast<size_t>(rows), 1), seeds(targets.size()),
      positions(targets.size());
  for (size_t r = 0; r < seeds.size(); ++r) seeds[r] = 1000 + static_cast<int64_t>(r);
  const std::vector<float> one(targets.size(), 1.0f), zero(targets.size(), 0.0f);
  const std::vector<int32_t> top50(targets.size(), 50);
  const detlogp::ExecOptions exec{.threads = 1};
  detlogp::SelfComm self;
  const detlogp::SampleOptions base{.seeds = seeds, .positions = positions, .exec = exec};
  auto run = [&](int which) {
    detlogp::SampleOptions o = base;
    switch (which) {
      case 0:
        op.forward(sharp_view, targets, c, self, {.exec = exec});
        return;
      case 1:
        o.temperature = one;
        detlogp::sample(op, sharp_view, c, self, o);
        return;
      case 2:
        o.temperature = one;
        detlogp::sample(op, flat_view, c, self, o);
        return;
      case 3:
        o.temperature = one;
        o.top_k = top50;
        detlogp::sample(op, sharp_view, c, self, o);
        return;
      default:
        o.temperature = zero;
        detlogp::sample(op, sharp_view, c, self, o);
    }
  };
  constexpr int kCases = 5;
  double best[kCases];
  std::fill(best, best + kCases, 1e30);
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    for (int which = 0; which < kCases; ++which) {
      const double t0 = thread_cpu_seconds();
      run(which);
      const double t = thread_cpu_seconds() - t0;
      if (rep > 0) best[which] = std::min(best[which], t);
    }
  }
  std::printf(
      "bench_sample: %s, bf16, %lld rows x %lld columns (TP 1), 1 thread, min thread CPU time "
      "of %d runs, interleaved\n",
      op.kernel_name().c_str(), static_cast<long long>(rows), static_cast<long long>(kVocab), reps);
  std::printf("%-44s %10s %8s\n", "call", "ms", "/ fwd");
  const char* names[kCases] = {"forward (plain logp)", "sample, full vocab, logits scale 5",
                               "sample, full vocab, logits scale 0.5", "sample, top_k 50",
                               "sample, greedy"};
  for (int which = 0; which < kCases; ++which) {
    std::printf("%-44s %10.2f %8.2f\n", names[which], 1e3 * best[which], best[which] / best[0]);
  }
  return 0;
}
