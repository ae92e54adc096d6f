// Exhaustive accuracy of the canon's det_exp and det_log against double-precision libm
// (numerics.md "Arithmetic"): det_exp within 1 ulp for EVERY float in [-87, 0] (about 1.1e9
// values), det_log within 1 ulp for every float in [1, 2^24] (about 2e8). Two threads. Not a
// unit test (ctest label "exhaustive", so the sanitizer run skips it): about 10-25 s here.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "numerics/canon.hpp"
#include "ulp.hpp"

namespace {

using detlogp::canon::bits_of;
using detlogp::canon::float_of;

struct Worst {
  double ulps = 0.0;
  uint32_t at = 0;
  uint64_t count = 0;
};

// Sweeps bit patterns [first, last] (inclusive) over `threads` threads, interleaved in chunks.
template <typename F, typename Ref>
Worst sweep(uint32_t first, uint32_t last, int threads, F f, Ref ref) {
  constexpr uint64_t kChunk = 1 << 20;
  std::atomic<uint64_t> next{first};
  std::vector<Worst> worst(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Worst w;
      for (;;) {
        const uint64_t begin = next.fetch_add(kChunk);
        if (begin > last) break;
        const uint64_t end = begin + kChunk - 1 < last ? begin + kChunk - 1 : last;
        for (uint64_t b = begin; b <= end; ++b) {
          const float x = float_of(static_cast<uint32_t>(b));
          const double e = detlogp::testing::ulp_error(f(x), ref(static_cast<double>(x)));
          if (!(e <= w.ulps)) {  // also catches NaN errors
            w.ulps = std::isnan(e) ? 1e30 : e;
            w.at = static_cast<uint32_t>(b);
          }
          ++w.count;
        }
      }
      worst[static_cast<size_t>(t)] = w;
    });
  }
  for (auto& th : pool) th.join();
  Worst total;
  for (const Worst& w : worst) {
    total.count += w.count;
    if (w.ulps > total.ulps) {
      total.ulps = w.ulps;
      total.at = w.at;
    }
  }
  return total;
}

bool report(const char* name, const Worst& w, double seconds) {
  const bool ok = w.ulps <= 1.0;
  std::printf("%s: %llu floats, max error %.4f ulp at %.9g (0x%08x), %.1f s: %s\n", name,
              static_cast<unsigned long long>(w.count), w.ulps, static_cast<double>(float_of(w.at)),
              w.at, seconds, ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace

int main() {
  const int threads = 2;
  using clock = std::chrono::steady_clock;
  bool ok = true;

  auto t0 = clock::now();
  // [-87, 0]: sign-bit patterns from -0 (0x80000000) up to -87 (bits of -87.0f).
  const Worst e = sweep(0x80000000u, bits_of(-87.0f), threads, detlogp::canon::det_exp,
                        [](double x) { return std::exp(x); });
  ok = report("det_exp on [-87, 0]", e, std::chrono::duration<double>(clock::now() - t0).count()) &&
       ok;

  t0 = clock::now();
  const Worst l = sweep(bits_of(1.0f), bits_of(16777216.0f), threads, detlogp::canon::det_log,
                        [](double x) { return std::log(x); });
  ok =
      report("det_log on [1, 2^24]", l, std::chrono::duration<double>(clock::now() - t0).count()) &&
      ok;
  return ok ? 0 : 1;
}
