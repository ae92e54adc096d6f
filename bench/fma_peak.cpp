// This machine's fp32 FMA peak, for the fused lm_head benchmark's ratio: a Highway loop of 16
// independent multiply-add chains per thread (enough to cover the FMA latency on every
// target), dispatched to the best target this CPU has, timed on 1..N threads.
#include "fma_peak.hpp"

#include <chrono>
#include <thread>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "fma_peak.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace detlogp::bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Runs `iters` rounds of 16 vector FMAs; returns flops done and a sink value.
double FmaLoop(int64_t iters, float* sink) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  V acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = hn::Set(d, static_cast<float>(i));
  const V a = hn::Set(d, 0.999999f);
  const V b = hn::Set(d, 1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 16; ++i) acc[i] = hn::MulAdd(acc[i], a, b);
  }
  V sum = acc[0];
  for (int i = 1; i < 16; ++i) sum = hn::Add(sum, acc[i]);
  *sink = hn::GetLane(sum);
  return static_cast<double>(iters) * 16.0 * 2.0 * static_cast<double>(hn::Lanes(d));
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace detlogp::bench
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace detlogp::bench {
HWY_EXPORT(FmaLoop);

double fma_peak_gflops(int threads, double seconds) {
  // Calibrate the iteration count on one thread, then time every thread running it.
  float sink = 0;
  int64_t iters = 1 << 20;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    HWY_DYNAMIC_DISPATCH(FmaLoop)(iters, &sink);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > seconds / 4) {
      iters = static_cast<int64_t>(static_cast<double>(iters) * seconds / s);
      break;
    }
    iters *= 2;
  }
  std::vector<float> sinks(static_cast<std::size_t>(threads));
  std::vector<double> flops(static_cast<std::size_t>(threads));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] { flops[t] = HWY_DYNAMIC_DISPATCH(FmaLoop)(iters, &sinks[t]); });
  }
  for (auto& th : pool) th.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double total = 0;
  for (double f : flops) total += f;
  return total / s / 1e9;
}

}  // namespace detlogp::bench
#endif  // HWY_ONCE
