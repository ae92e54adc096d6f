#pragma once
// The measured fp32 FMA peak of this machine (fma_peak.cpp).

namespace detlogp::bench {

// GFLOP/s (2 flops per FMA lane) of `threads` threads each running independent FMA chains for
// about `seconds`, on the best Highway target of this CPU.
double fma_peak_gflops(int threads, double seconds);

}  // namespace detlogp::bench
