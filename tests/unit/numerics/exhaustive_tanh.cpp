// Exhaustive accuracy of the canon's det_tanh against double-precision libm tanh (numerics.md
// "det_tanh"): at most 2 ulp for every float, NaN in NaN out, +-inf -> +-1, and oddness bit for
// bit (det_tanh(-x) == -det_tanh(x), det_tanh(-0) == -0), |det_tanh(x)| <= 1.
//
// Two tiers. Without arguments (label "exhaustive", make test): every float in [0, 16] (about
// 1.1e9 values; above 16, t = det_exp(-2a) < 2^-46 and det_tanh is exactly 1, as is tanh), two
// threads, about 2 minutes on two loaded cores. With --all (label "long", make test-long):
// every one of the 2^32 bit patterns, the negative half checked against the positive half bit for
// bit.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "numerics/canon.hpp"
#include "ulp.hpp"

namespace {

using detlogp::canon::bits_of;
using detlogp::canon::det_tanh;
using detlogp::canon::float_of;

constexpr double kBoundUlp = 2.0;

struct Result {
  double ulps = 0.0;  // worst error of the non-negative floats
  uint32_t at = 0;
  uint64_t count = 0;
  uint64_t failures = 0;  // wrong specials or broken oddness
  uint32_t first_failure = 0;
};

void fail(Result& r, uint32_t b) {
  if (r.failures++ == 0) r.first_failure = b;
}

// One bit pattern: accuracy for x >= 0 (and NaN), oddness for x < 0.
void check(uint32_t b, Result& r) {
  const float x = float_of(b);
  const float y = det_tanh(x);
  ++r.count;
  if (x != x) {
    if (y == y) fail(r, b);
    return;
  }
  if (!(y <= 1.0f && y >= -1.0f)) {
    fail(r, b);
    return;
  }
  if ((b & 0x80000000u) != 0) {
    if (bits_of(y) != (bits_of(det_tanh(-x)) ^ 0x80000000u)) fail(r, b);
    return;
  }
  const double e = detlogp::testing::ulp_error(y, std::tanh(static_cast<double>(x)));
  if (!(e <= r.ulps)) {
    r.ulps = std::isnan(e) ? 1e30 : e;
    r.at = b;
  }
}

// Bit patterns [first, last] (inclusive) over `threads` threads, in chunks.
Result sweep(uint64_t first, uint64_t last, int threads) {
  constexpr uint64_t kChunk = 1 << 20;
  std::atomic<uint64_t> next{first};
  std::vector<Result> part(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Result r;
      for (;;) {
        const uint64_t begin = next.fetch_add(kChunk);
        if (begin > last) break;
        const uint64_t end = begin + kChunk - 1 < last ? begin + kChunk - 1 : last;
        for (uint64_t b = begin; b <= end; ++b) check(static_cast<uint32_t>(b), r);
      }
      part[static_cast<size_t>(t)] = r;
    });
  }
  for (auto& th : pool) th.join();
  Result total;
  for (const Result& r : part) {
    total.count += r.count;
    if (r.failures != 0 && total.failures == 0) total.first_failure = r.first_failure;
    total.failures += r.failures;
    if (r.ulps > total.ulps) {
      total.ulps = r.ulps;
      total.at = r.at;
    }
  }
  return total;
}

bool specials() {
  bool ok = true;
  const float inf = detlogp::canon::kInf;
  ok = ok && det_tanh(inf) == 1.0f && det_tanh(-inf) == -1.0f;
  ok = ok && bits_of(det_tanh(0.0f)) == 0u && bits_of(det_tanh(-0.0f)) == 0x80000000u;
  ok = ok && det_tanh(16.0f) == 1.0f && det_tanh(1e30f) == 1.0f;
  // The smallest subnormal: tanh(x) = x.
  ok = ok && det_tanh(float_of(1u)) == float_of(1u);
  std::printf("det_tanh special values: %s\n", ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const bool all = argc > 1 && std::strcmp(argv[1], "--all") == 0;
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t last = all ? 0xffffffffu : bits_of(16.0f);
  const Result r = sweep(0, last, 2);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool accurate = r.ulps <= kBoundUlp;
  std::printf("det_tanh on %s: %llu floats, max error %.4f ulp at %.9g (0x%08x), %.1f s: %s\n",
              all ? "every fp32 bit pattern" : "[0, 16]", static_cast<unsigned long long>(r.count),
              r.ulps, static_cast<double>(float_of(r.at)), r.at, seconds,
              accurate ? "ok" : "FAILED");
  if (r.failures != 0) {
    std::printf("det_tanh: %llu wrong NaN, |y| > 1 or oddness results, first at 0x%08x: FAILED\n",
                static_cast<unsigned long long>(r.failures), r.first_failure);
  }
  return accurate && r.failures == 0 && specials() ? 0 : 1;
}
