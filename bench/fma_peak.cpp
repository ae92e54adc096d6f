// This machine's fp32 FMA peak, for the fused lm_head benchmark's ratio: a Highway loop of
// independent multiply-add chains per thread, all in registers (as a BLAS kernel keeps its
// accumulators), dispatched to the best target this CPU has, timed on 1..N threads.
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

// Independent chains: enough to cover the FMA latency times the FMA ports (4 x 2 on current
// x86 cores, 8 chains), few enough that the chains and the two operands stay in registers.
// x86 before AVX-512 has 16 vector registers: 16 chains + 2 operands spill, and the loop then
// measures the spills (on a Zen 3 it printed 57 GFLOP/s per core where OpenBLAS's sgemm ran at
// 88); 12 chains fit. AVX-512, NEON and SVE have 32 registers.
#if HWY_ARCH_X86 && HWY_TARGET >= HWY_AVX2
constexpr int kChains = 12;
#else
constexpr int kChains = 16;
#endif

// Runs `iters` rounds of kChains vector FMAs; returns flops done and a sink value.
double FmaLoop(int64_t iters, float* sink) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  V acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = hn::Set(d, static_cast<float>(i));
  const V a = hn::Set(d, 0.999999f);
  const V b = hn::Set(d, 1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = hn::MulAdd(acc[i], a, b);
  }
  V sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = hn::Add(sum, acc[i]);
  *sink = hn::GetLane(sum);
  return static_cast<double>(iters) * kChains * 2.0 * static_cast<double>(hn::Lanes(d));
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
