// What the logit softcap costs over plain logp (docs/benchmarks.md "The logit softcap"): the
// SIMD kernels on one TP shard of a Gemma-like vocabulary (262144 / TP columns, bf16, a few
// hundred tokens), forward (partials of the shard's cover, roots), forward with entropy and
// backward, each without and with a cap of 30, the two interleaved in one run (A/B, so a
// loaded machine slows both alike). Reports the minimum thread CPU time on one thread (robust to
// other processes) and the ratio capped / plain. Then what the cap's parts cost per element on
// their own, on the same logits (one row at a time, in cache): the target's vector det_tanh (of
// x / cap) and det_exp (of -|x|), each beside the plain and the capped forward per element.
//
//   bench_softcap [--rows 256] [--tp 4] [--reps 7]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench_clock.hpp"
#include "detlogp/dtype.hpp"
#include "detlogp/kernels.hpp"
#include "kernels/cpu/simd/simd_kernels.hpp"

namespace {

constexpr int64_t kVocab = 262144;
constexpr int64_t kTileWidth = 128;

struct Case {
  const detlogp::ShardKernels& k;
  detlogp::LogitsView view;
  detlogp::ShardSpec spec = {};
  std::vector<detlogp::TreeNode> cover = {};
  std::vector<detlogp::NodePartial> partials = {};
  std::vector<float> lse = {}, entropy = {}, g = {};
  std::vector<int64_t> target = {};
  std::vector<uint16_t> grad = {};
  detlogp::ExecOptions exec{.threads = 1};

  void forward(bool with_entropy) {
    k.node_partials(view, spec, cover, with_entropy, partials, exec);
    k.merge_roots(
        spec.geometry, cover, partials, view.rows,
        detlogp::RootsOut{lse, with_entropy ? std::span<float>(entropy) : std::span<float>()},
        exec);
  }
  void backward() {
    detlogp::BackwardInputs in{.lse = lse,
                               .entropy = entropy,
                               .target_local = target,
                               .grad_logp = g,
                               .grad_lse = g,
                               .grad_entropy = g};
    detlogp::MutableLogitsView gv{grad.data(), view.dtype, view.rows, view.cols, view.cols};
    k.backward(view, spec, in, gv, exec);
  }
};

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 256, tp = 4;
  int reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rows") rows = std::atoll(argv[i + 1]);
    if (a == "--tp") tp = std::atoll(argv[i + 1]);
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
  }
  const int64_t cols = kVocab / tp;
  std::vector<uint16_t> data(static_cast<size_t>(rows * cols));
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 8.0f);
  for (auto& h : data) h = detlogp::float_to_bf16(normal(rng));
  const detlogp::ShardKernels& k = detlogp::simd_kernels();
  auto make = [&](float softcap) {
    Case c{.k = k,
           .view = detlogp::LogitsView{data.data(), detlogp::DType::bf16, rows, cols, cols}};
    c.spec.geometry = detlogp::TileGeometry{cols, kTileWidth};  // the shard as its own vocab
    c.spec.softcap = softcap;
    c.cover = detlogp::canonical_cover(c.spec.geometry, 0, cols / kTileWidth);
    c.partials.resize(static_cast<size_t>(rows) * c.cover.size());
    c.lse.resize(static_cast<size_t>(rows));
    c.entropy.resize(c.lse.size());
    c.g.assign(c.lse.size(), 0.5f);
    c.target.resize(c.lse.size());
    for (size_t r = 0; r < c.target.size(); ++r) {
      c.target[r] = static_cast<int64_t>((r * 7919) % cols);
    }
    c.grad.resize(data.size());
    return c;
  };
  Case plain = make(0.0f);
  Case capped = make(30.0f);
  const std::function<void(Case&)> ops[] = {[](Case& c) { c.forward(false); },
                                            [](Case& c) { c.forward(true); },
                                            [](Case& c) { c.backward(); }};
  const char* names[] = {"forward", "forward+entropy", "backward"};
  double forward_s[2] = {0, 0};  // the forward's best seconds, plain and capped
  std::printf(
      "bench_softcap: %s, bf16, %lld rows x %lld columns (vocab %lld / TP %lld), "
      "1 thread, min thread CPU time of %d runs, A/B interleaved\n",
      k.name().c_str(), static_cast<long long>(rows), static_cast<long long>(cols),
      static_cast<long long>(kVocab), static_cast<long long>(tp), reps);
  std::printf("%-16s %12s %12s %8s\n", "op", "plain ms", "softcap ms", "ratio");
  for (int op = 0; op < 3; ++op) {
    double best[2] = {1e30, 1e30};
    for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
      for (int which = 0; which < 2; ++which) {
        Case& c = which == 0 ? plain : capped;
        if (op == 2) c.forward(true);  // backward needs this case's roots
        const double t0 = thread_cpu_seconds();
        ops[op](c);
        const double t = thread_cpu_seconds() - t0;
        if (rep > 0) best[which] = std::min(best[which], t);
      }
    }
    std::printf("%-16s %12.2f %12.2f %8.3f\n", names[op], 1e3 * best[0], 1e3 * best[1],
                best[1] / best[0]);
    if (op == 0) forward_s[0] = best[0], forward_s[1] = best[1];
  }
  // The parts, element-wise over every row (one row's 64K floats at a time, in L2).
  const detlogp::simd::TargetOps target = detlogp::simd::supported_target_ops().front();
  std::vector<float> x(static_cast<size_t>(cols)), y(x.size());
  auto per_element = [&](void (*fn)(const float*, float*, int64_t), auto prepare) {
    double best = 1e30;
    for (int rep = 0; rep <= reps; ++rep) {
      double total = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          uint32_t u = static_cast<uint32_t>(data[static_cast<size_t>(r * cols + c)]) << 16;
          float v;
          std::memcpy(&v, &u, 4);
          x[static_cast<size_t>(c)] = prepare(v);
        }
        const double t0 = thread_cpu_seconds();
        fn(x.data(), y.data(), cols);
        total += thread_cpu_seconds() - t0;
      }
      if (rep > 0) best = std::min(best, total);
    }
    return 1e9 * best / static_cast<double>(rows * cols);
  };
  const double elements = static_cast<double>(rows * cols);
  const double tanh_ns = per_element(target.det_tanh_array, [](float v) { return v / 30.0f; });
  const double exp_ns = per_element(target.det_exp_array, [](float v) { return -std::fabs(v); });
  std::printf(
      "per element (%s): forward %.3f ns, softcap forward %.3f ns (+%.3f); "
      "det_tanh %.3f ns, det_exp %.3f ns (each an element-wise array: load, store)\n",
      target.name, 1e9 * forward_s[0] / elements, 1e9 * forward_s[1] / elements,
      1e9 * (forward_s[1] - forward_s[0]) / elements, tanh_ns, exp_ns);
  return 0;
}
