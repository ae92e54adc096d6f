// What the candidate scan of recomputed kept sets costs (docs/benchmarks.md "Recomputed kept
// sets"): on one TP shard of a Qwen-like vocabulary (151936 / TP columns, bf16, a few hundred
// tokens), the forward's shard work (partials of the shard's cover, roots; SIMD kernels) against
// the scan of the shard's first candidates of each row: 50 (top_k = 50) and 1024 (top-p without
// top-k), interleaved in one run (A/B, so a loaded machine slows all alike). Reports the minimum
// thread CPU time on one thread and the ratio scan / forward.
//
//   bench_kept_selection [--rows 256] [--tp 1] [--reps 7]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "bench_clock.hpp"
#include "detlogp/dtype.hpp"
#include "detlogp/kernels.hpp"
#include "kernels/common/top_candidates.hpp"

namespace {

constexpr int64_t kVocab = 151936;
constexpr int64_t kTileWidth = 128;

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 256, tp = 1;
  int reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rows") rows = std::atoll(argv[i + 1]);
    if (a == "--tp") tp = std::atoll(argv[i + 1]);
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
  }
  const int64_t cols = kVocab / tp / kTileWidth * kTileWidth;
  std::vector<uint16_t> data(static_cast<size_t>(rows * cols));
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 5.0f);
  for (auto& h : data) h = detlogp::float_to_bf16(normal(rng));
  const detlogp::ShardKernels& k = detlogp::simd_kernels();
  const detlogp::LogitsView view{data.data(), detlogp::DType::bf16, rows, cols, cols};
  detlogp::ShardSpec spec;
  spec.geometry = detlogp::TileGeometry{cols, kTileWidth};  // the shard as its own vocab
  const std::vector<detlogp::TreeNode> cover =
      detlogp::canonical_cover(spec.geometry, 0, cols / kTileWidth);
  std::vector<detlogp::NodePartial> partials(static_cast<size_t>(rows) * cover.size());
  std::vector<float> lse(static_cast<size_t>(rows));
  const detlogp::ExecOptions exec{.threads = 1};
  const int64_t counts[] = {50, 1024};
  std::vector<detlogp::kernels::Candidate> out(static_cast<size_t>(rows * 1024));
  auto run = [&](int which) {
    if (which == 0) {
      k.node_partials(view, spec, cover, false, partials, exec);
      k.merge_roots(spec.geometry, cover, partials, rows, detlogp::RootsOut{lse, {}}, exec);
      return;
    }
    const int64_t count = counts[which - 1];
    const std::vector<int64_t> per_row(static_cast<size_t>(rows), count);
    detlogp::kernels::shard_top_candidates(
        view, spec, per_row, count,
        std::span<detlogp::kernels::Candidate>(out.data(), static_cast<size_t>(rows * count)),
        exec);
  };
  double best[3] = {1e30, 1e30, 1e30};
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    for (int which = 0; which < 3; ++which) {
      const double t0 = thread_cpu_seconds();
      run(which);
      const double t = thread_cpu_seconds() - t0;
      if (rep > 0) best[which] = std::min(best[which], t);
    }
  }
  std::printf(
      "bench_kept_selection: %s forward, bf16, %lld rows x %lld columns (vocab %lld / TP %lld), "
      "1 thread, min thread CPU time of %d runs, interleaved\n",
      k.name().c_str(), static_cast<long long>(rows), static_cast<long long>(cols),
      static_cast<long long>(kVocab), static_cast<long long>(tp), reps);
  std::printf("%-28s %10s %8s\n", "op", "ms", "/ fwd");
  const char* names[] = {"forward (partials, roots)", "scan, 50 candidates",
                         "scan, 1024 candidates"};
  for (int which = 0; which < 3; ++which) {
    std::printf("%-28s %10.2f %8.2f\n", names[which], 1e3 * best[which], best[which] / best[0]);
  }
  return 0;
}
