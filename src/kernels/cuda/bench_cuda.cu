// GPU benchmark of the CUDA backend (docs/cuda.md): device-to-device copy bandwidth measured in
// the same run, then forward (node partials of the canonical cover + merge_roots + target
// logits: what one rank's VocabParallelLogprob::forward does on the device) for bf16 and fp32,
// with and without entropy, and backward. Each case: one warm-up, then the median of `reps`
// synchronous calls (host clock; the calls return when their device work is done).
//
//   bench_cuda [--rows 4096] [--vocab 151936] [--reps 10] [--json out.jsonl]
//
// Prints a table; with --json also one JSON object per case (read by scripts/gpu-check.sh).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "detlogp/cuda.hpp"
#include "detlogp/kernels.hpp"
#include "numerics/canon.hpp"

namespace {

using Clock = std::chrono::steady_clock;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_cuda: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Logits ~ 3 * (sum of 4 uniforms - 2) * sqrt(3), from a counter hash: reproducible, no host
// generation of gigabytes.
__global__ void fill_kernel(void* data, int dtype, int64_t n, uint64_t stream) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t x = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull + stream;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    float acc = 0.0f;
    for (int q = 0; q < 4; ++q) acc += static_cast<float>((x >> (16 * q)) & 0xffffu) / 65536.0f;
    const float v = (acc - 2.0f) * 5.196f;
    if (dtype == static_cast<int>(detlogp::DType::fp32)) {
      static_cast<float*>(data)[i] = v;
    } else if (dtype == static_cast<int>(detlogp::DType::bf16)) {
      static_cast<uint16_t*>(data)[i] = detlogp::canon::float_to_bf16(v);
    } else {
      static_cast<uint16_t*>(data)[i] = detlogp::canon::float_to_fp16(v);
    }
  }
}

double median_seconds(int reps, const std::function<void()>& fn) {
  fn();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Row {
  std::string name;
  double seconds;
  double bytes;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 4096;
  int64_t vocab = 151936;
  int reps = 10;
  std::string json;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rows")
      rows = std::atoll(argv[i + 1]);
    else if (a == "--vocab")
      vocab = std::atoll(argv[i + 1]);
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (a == "--json")
      json = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_cuda: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::string why;
  if (detlogp::cuda_device_count(&why) == 0) {
    std::printf("bench_cuda: SKIPPED: no CUDA device (%s)\n", why.c_str());
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s (sm_%d%d, %d SMs), rows %lld, vocab %lld, reps %d\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, static_cast<long long>(rows),
              static_cast<long long>(vocab), reps);

  const detlogp::CudaShardKernels kernels;
  const size_t n = static_cast<size_t>(rows * vocab);
  std::vector<Row> results;

  // Device-to-device copy of the fp32 logits' size (bytes read + bytes written).
  {
    void* a = nullptr;
    void* b = nullptr;
    const size_t bytes = n * 4;
    check(cudaMalloc(&a, bytes), "cudaMalloc");
    check(cudaMalloc(&b, bytes), "cudaMalloc");
    fill_kernel<<<4096, 256>>>(a, static_cast<int>(detlogp::DType::fp32), static_cast<int64_t>(n),
                               1);
    check(cudaDeviceSynchronize(), "fill");
    const double s = median_seconds(reps, [&] {
      check(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
      check(cudaDeviceSynchronize(), "sync");
    });
    results.push_back({"d2d_copy", s, 2.0 * static_cast<double>(bytes)});
    cudaFree(a);
    cudaFree(b);
  }
  const double copy_bw = results[0].bytes / results[0].seconds;

  const detlogp::TileGeometry geometry{.real_vocab = vocab, .tile_width = 128};
  const std::vector<detlogp::TreeNode> cover =
      detlogp::canonical_cover(geometry, 0, geometry.num_real_tiles());
  std::vector<int64_t> targets(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) targets[static_cast<size_t>(r)] = (r * 7919) % vocab;

  for (detlogp::DType dtype : {detlogp::DType::bf16, detlogp::DType::fp32}) {
    const char* dn = dtype == detlogp::DType::bf16 ? "bf16" : "fp32";
    const size_t bytes = n * detlogp::dtype_size(dtype);
    void* x = nullptr;
    void* g = nullptr;
    check(cudaMalloc(&x, bytes), "cudaMalloc logits");
    check(cudaMalloc(&g, bytes), "cudaMalloc grad");
    fill_kernel<<<4096, 256>>>(x, static_cast<int>(dtype), static_cast<int64_t>(n), 7);
    check(cudaDeviceSynchronize(), "fill");
    const detlogp::LogitsView view{x, dtype, rows, vocab, vocab};
    const detlogp::ShardSpec spec{.vocab_start = 0, .geometry = geometry, .temperature = 1.0f};
    std::vector<detlogp::NodePartial> partials(static_cast<size_t>(rows) * cover.size());
    std::vector<float> lse(static_cast<size_t>(rows)), entropy(static_cast<size_t>(rows));
    std::vector<float> tz(static_cast<size_t>(rows));
    for (bool with_entropy : {false, true}) {
      const double s = median_seconds(reps, [&] {
        kernels.node_partials(view, spec, cover, with_entropy, partials);
        kernels.merge_roots(
            geometry, cover, partials, rows,
            detlogp::RootsOut{lse, with_entropy ? std::span<float>(entropy) : std::span<float>()});
        kernels.read_target_logits(view, spec, targets, tz);
      });
      results.push_back({std::string("forward_") + dn + (with_entropy ? "_entropy" : ""), s,
                         static_cast<double>(bytes)});
    }
    std::vector<float> glogp(static_cast<size_t>(rows), 1.0f);
    detlogp::BackwardInputs in;
    in.lse = lse;
    in.target_local = targets;
    in.grad_logp = glogp;
    const detlogp::MutableLogitsView gv{g, dtype, rows, vocab, vocab};
    const double s = median_seconds(reps, [&] { kernels.backward(view, spec, in, gv); });
    results.push_back({std::string("backward_") + dn, s, 2.0 * static_cast<double>(bytes)});
    cudaFree(x);
    cudaFree(g);
  }

  std::FILE* jf = json.empty() ? nullptr : std::fopen(json.c_str(), "w");
  std::printf("%-24s %10s %10s %12s\n", "case", "ms", "GB/s", "of D2D copy");
  for (const Row& r : results) {
    const double bw = r.bytes / r.seconds;
    std::printf("%-24s %10.3f %10.1f %11.1f%%\n", r.name.c_str(), r.seconds * 1e3, bw / 1e9,
                100.0 * bw / copy_bw);
    if (jf) {
      std::fprintf(jf,
                   "{\"case\": \"%s\", \"ms\": %.6f, \"bytes\": %.0f, \"gbps\": %.3f, "
                   "\"fraction_of_d2d\": %.4f, \"rows\": %lld, \"vocab\": %lld, \"device\": "
                   "\"%s\"}\n",
                   r.name.c_str(), r.seconds * 1e3, r.bytes, bw / 1e9, bw / copy_bw,
                   static_cast<long long>(rows), static_cast<long long>(vocab), prop.name);
    }
  }
  if (jf) std::fclose(jf);
  return 0;
}
