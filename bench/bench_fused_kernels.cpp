// The fused lm_head's dense kernels alone (docs/benchmarks.md, "The fused lm_head"): the best
// SIMD target's dot tile and its two gradient chains on the op's shapes (a block of `rows`
// hidden rows against `tiles` tiles of `cols` weight rows, each tile's weight rows fresh from
// memory), timed in CPU seconds of the calling thread, so that a loaded machine slows the
// figures less than it slows wall time. One thread; best of `reps`. One JSON object on stdout.
// For an A/B, run two builds alternately; in the same run, dot_tile_unblocked_gflops_cpu is the
// register-blocked tile without AVX2's lane GEMM and dot_tile_halves_gflops_cpu AVX2's tile before
// the lane GEMM (both the same function as dot_tile on other targets); dot_packed_rows_gflops_cpu
// is dot_tile as the op calls it, the rows packed once (pack_rows) for every tile.
//
//   bench_fused_kernels --rows 96 --cols 128 --hidden 4096 --tiles 40   (the op's tile; 40
//   tiles of weights, 80 MiB, do not stay in a 32 MiB L3)
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_clock.hpp"
#include "kernels/cpu/fused/dot_kernels.hpp"

namespace {

template <class Fn>
double best_cpu_seconds(int reps, const Fn& fn) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const double t0 = thread_cpu_seconds();
    fn();
    best = std::min(best, thread_cpu_seconds() - t0);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 96, cols = 128, hidden = 4096, tiles = 40;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (k == "--rows")
      rows = v;
    else if (k == "--cols")
      cols = v;
    else if (k == "--hidden")
      hidden = v;
    else if (k == "--tiles")
      tiles = v;
    else if (k == "--reps")
      reps = static_cast<int>(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](int64_t n, float scale) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = normal(gen) * scale;
    return v;
  };
  const std::vector<float> x = random(rows * hidden, 1.0f);
  const std::vector<float> w = random(tiles * cols * hidden, 0.04f);
  const std::vector<float> g = random(rows * cols, 1e-3f);
  std::vector<float> z(static_cast<std::size_t>(rows * cols));
  std::vector<float> gx(static_cast<std::size_t>(rows * hidden));
  std::vector<float> gw(static_cast<std::size_t>(tiles * cols * hidden));
  const detlogp::fused::DotOps& ops = detlogp::fused::simd_dot_ops().front();
  const double flop = 2.0 * static_cast<double>(rows * cols * hidden * tiles);
  const double dot_s = best_cpu_seconds(reps, [&] {
    for (int64_t t = 0; t < tiles; ++t) {
      ops.dot_tile(x.data(), hidden, rows, w.data() + t * cols * hidden, hidden, cols, hidden,
                   z.data(), cols);
    }
  });
  // As the op runs it: the block's rows packed once, every tile on them.
  detlogp::fused::PackedRows packed;
  const double packed_s = best_cpu_seconds(reps, [&] {
    ops.pack_rows(x.data(), hidden, rows, hidden, packed);
    for (int64_t t = 0; t < tiles; ++t) {
      ops.dot_packed(packed, w.data() + t * cols * hidden, hidden, cols, z.data(), cols);
    }
  });
  const double unblocked_s = best_cpu_seconds(reps, [&] {
    for (int64_t t = 0; t < tiles; ++t) {
      ops.dot_tile_unblocked(x.data(), hidden, rows, w.data() + t * cols * hidden, hidden, cols,
                             hidden, z.data(), cols);
    }
  });
  const double halves_s = best_cpu_seconds(reps, [&] {
    for (int64_t t = 0; t < tiles; ++t) {
      ops.dot_tile_halves(x.data(), hidden, rows, w.data() + t * cols * hidden, hidden, cols,
                          hidden, z.data(), cols);
    }
  });
  // grad_hidden: [rows, H] from the tile's [cols, H] weight rows; grad_weight: the tile's
  // [cols, H] rows continued over the block's tokens.
  const double hidden_s = best_cpu_seconds(reps, [&] {
    for (int64_t t = 0; t < tiles; ++t) {
      ops.chain(g.data(), cols, 1, rows, cols, w.data() + t * cols * hidden, hidden, hidden,
                gx.data(), hidden, true);
    }
  });
  const double weight_s = best_cpu_seconds(reps, [&] {
    for (int64_t t = 0; t < tiles; ++t) {
      ops.chain(g.data(), 1, cols, cols, rows, x.data(), hidden, hidden,
                gw.data() + t * cols * hidden, hidden, false);
    }
  });
  std::printf(
      "{\"bench\": \"fused_kernels\", \"kernel\": \"%s\", \"rows\": %lld, \"cols\": %lld, "
      "\"hidden\": %lld, \"tiles\": %lld, \"dot_tile_gflops_cpu\": %.2f, "
      "\"dot_packed_rows_gflops_cpu\": %.2f, "
      "\"dot_tile_unblocked_gflops_cpu\": %.2f, \"dot_tile_halves_gflops_cpu\": %.2f, "
      "\"chain_hidden_gflops_cpu\": %.2f, \"chain_weight_gflops_cpu\": %.2f}\n",
      ops.name.c_str(), static_cast<long long>(rows), static_cast<long long>(cols),
      static_cast<long long>(hidden), static_cast<long long>(tiles), flop / dot_s / 1e9,
      flop / packed_s / 1e9, flop / unblocked_s / 1e9, flop / halves_s / 1e9, flop / hidden_s / 1e9,
      flop / weight_s / 1e9);
  return 0;
}
