// The CUDA kernels against the scalar reference, bitwise (raw bit patterns): node partials of
// every shard's canonical cover, roots (LSE, entropy), target logits, logp and gradients, for
// bf16, fp16 and fp32, on random, adversarial and Qwen3-shaped inputs, with row strides,
// temperatures and several tile widths (the W <= 128 register path and the any-width path);
// TP = 1, 2, 4 (even and uneven cuts) equal to each other; the operator over the CUDA kernels
// equal to the operator over the CPU kernels at TP = 1, 2, 4 (in-process group on one GPU).
//
// Every GPU test skips with a clear message where no CUDA device exists (label `gpu`). The
// CudaBackendHost tests need no device: the capability, and dispatch on the "cuda" platform
// refusing truthfully where there is none.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/cuda.hpp"
#include "detlogp/cuda_registry.hpp"
#include "detlogp/errors.hpp"
#include "detlogp/kernels.hpp"
#include "detlogp/operator.hpp"
#include "detlogp/registry.hpp"
#include "kernels/cuda/exp_shift.hpp"
#include "numerics/canon.hpp"
#include "testing/logits_gen.hpp"
#include "testing/shard_pipeline.hpp"

namespace detlogp {
namespace {

using testing::Logits;
using testing::RowKind;

// Skips the calling test when there is no CUDA device.
#define DETLOGP_REQUIRE_GPU()                                                            \
  do {                                                                                   \
    std::string why_;                                                                    \
    if (cuda_device_count(&why_) == 0) {                                                 \
      GTEST_SKIP() << "no CUDA device on this machine (" << why_                         \
                   << "); the CUDA backend is checked by scripts/gpu-check.sh on a GPU"; \
    }                                                                                    \
  } while (0)

// A device copy of a host Logits buffer (same shape, dtype and row stride).
class DeviceLogits {
 public:
  explicit DeviceLogits(const Logits& host) : host_(host) {
    bytes_ = host.bytes.size();
    EXPECT_EQ(cudaMalloc(&data_, bytes_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.bytes.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceLogits() { cudaFree(data_); }
  DeviceLogits(const DeviceLogits&) = delete;
  DeviceLogits& operator=(const DeviceLogits&) = delete;

  LogitsView view_cols(int64_t col_begin, int64_t ncols) const {
    const int64_t at = col_begin < host_.cols ? col_begin : host_.cols;
    return LogitsView{static_cast<const char*>(data_) + at * dtype_size(host_.dtype), host_.dtype,
                      host_.rows, ncols, host_.row_stride};
  }
  MutableLogitsView mutable_view_cols(int64_t col_begin, int64_t ncols) {
    const int64_t at = col_begin < host_.cols ? col_begin : host_.cols;
    return MutableLogitsView{static_cast<char*>(data_) + at * dtype_size(host_.dtype), host_.dtype,
                             host_.rows, ncols, host_.row_stride};
  }
  // The device buffer copied back into a host Logits of the same layout.
  Logits to_host() const {
    Logits out = host_;
    EXPECT_EQ(cudaMemcpy(out.bytes.data(), data_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  Logits host_;  // layout (and initial contents)
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// testing::forward_sharded on device logits through `kernels` (CudaShardKernels).
testing::ForwardResult forward_sharded_gpu(const CudaShardKernels& kernels, const Logits& x,
                                           const DeviceLogits& dx, const TileGeometry& geometry,
                                           std::span<const int64_t> cuts, float temperature,
                                           bool with_entropy, std::span<const int64_t> targets) {
  return testing::forward_sharded(
      kernels, x, geometry, cuts, temperature, with_entropy, targets,
      [&](int64_t begin, int64_t cols) { return dx.view_cols(begin, cols); });
}

// testing::backward_sharded on the device; the gradient comes back as a host Logits.
Logits backward_sharded_gpu(const CudaShardKernels& kernels, const Logits& x,
                            const DeviceLogits& dx, const TileGeometry& geometry,
                            std::span<const int64_t> cuts, float temperature,
                            std::span<const int64_t> targets, const testing::ForwardResult& fwd,
                            const testing::GradInputs& g) {
  DeviceLogits grad(testing::poisoned_logits(x.dtype, x.rows, x.cols, x.row_stride));
  testing::backward_shards(
      kernels, x, [&](int64_t begin, int64_t cols) { return dx.view_cols(begin, cols); },
      [&](int64_t begin, int64_t cols) { return grad.mutable_view_cols(begin, cols); }, geometry,
      cuts, temperature, targets, fwd, g);
  return grad.to_host();
}

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = canon::bits_of(v[i]);
  return out;
}

void expect_partials_equal(const std::vector<NodePartial>& a, const std::vector<NodePartial>& b,
                           const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same = canon::bits_of(a[i].m) == canon::bits_of(b[i].m) &&
                      canon::bits_of(a[i].s) == canon::bits_of(b[i].s) &&
                      canon::bits_of(a[i].u) == canon::bits_of(b[i].u);
    if (!same && bad++ < 5) {
      ADD_FAILURE() << what << ": partial " << i << " gpu (" << a[i].m << ", " << a[i].s << ", "
                    << a[i].u << ") cpu (" << b[i].m << ", " << b[i].s << ", " << b[i].u << ")";
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": partials differing";
}

void expect_grad_equal(const Logits& gpu, const Logits& cpu, const std::string& what) {
  size_t bad = 0;
  for (int64_t r = 0; r < cpu.rows; ++r) {
    for (int64_t c = 0; c < cpu.cols; ++c) {
      if (gpu.raw(r, c) != cpu.raw(r, c) && bad++ < 5) {
        ADD_FAILURE() << what << ": grad (" << r << ", " << c << ") gpu 0x" << std::hex
                      << gpu.raw(r, c) << " cpu 0x" << cpu.raw(r, c) << std::dec;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": gradient elements differing";
}

struct Case {
  DType dtype;
  int64_t rows;
  int64_t real;
  int64_t padded;
  int64_t tile_width;
  int64_t row_stride;  // -1: padded
  float temperature;
  std::vector<RowKind> kinds;
  int tp;
  bool even;
  uint64_t stream;
};

std::string describe(const Case& c) {
  return std::string(to_string(c.dtype)) + " rows=" + std::to_string(c.rows) +
         " R=" + std::to_string(c.real) + " padded=" + std::to_string(c.padded) +
         " W=" + std::to_string(c.tile_width) + " tau=" + std::to_string(c.temperature) +
         " tp=" + std::to_string(c.tp) + (c.even ? " even" : " uneven") +
         " stream=" + std::to_string(c.stream);
}

// GPU vs scalar reference, bitwise: partials, roots, target logits, logp, gradients.
void check_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  std::mt19937_64 rng(c.stream);
  std::vector<int64_t> targets;
  const Logits x =
      testing::make_logits(c.dtype, c.rows, c.padded, c.real, c.kinds, rng, &targets, c.row_stride);
  for (size_t r = 0; r < targets.size(); r += 5) targets[r] = -1;  // some inactive rows
  const DeviceLogits dx(x);
  const TileGeometry geometry{c.real, c.tile_width};
  const std::vector<int64_t> cuts = testing::make_cuts(c.padded, c.tile_width, c.tp, c.even, rng);
  const CudaShardKernels gpu;
  const ShardKernels& cpu = reference_kernels();
  for (bool entropy : {false, true}) {
    SCOPED_TRACE(entropy ? "with entropy" : "no entropy");
    const testing::ForwardResult want =
        testing::forward_sharded(cpu, x, geometry, cuts, c.temperature, entropy, targets);
    const testing::ForwardResult got =
        forward_sharded_gpu(gpu, x, dx, geometry, cuts, c.temperature, entropy, targets);
    ASSERT_EQ(got.nodes, want.nodes);
    expect_partials_equal(got.partials, want.partials, "node partials");
    EXPECT_EQ(bits_of(got.lse), bits_of(want.lse)) << "lse";
    EXPECT_EQ(bits_of(got.entropy), bits_of(want.entropy)) << "entropy";
    EXPECT_EQ(bits_of(got.target_z), bits_of(want.target_z)) << "target logits";
    EXPECT_EQ(bits_of(got.logp), bits_of(want.logp)) << "logp";
    // Backward with every incoming gradient supplied (entropy only when computed), and with
    // only grad_logp.
    std::normal_distribution<float> n1(0.0f, 1.0f);
    testing::GradInputs g;
    for (int64_t r = 0; r < c.rows; ++r) {
      const bool active = targets[static_cast<size_t>(r)] >= 0;
      g.grad_logp.push_back(active ? n1(rng) : 0.0f);
      g.grad_lse.push_back(n1(rng));
      if (entropy) g.grad_entropy.push_back(n1(rng));
    }
    const Logits want_grad =
        testing::backward_sharded(cpu, x, geometry, cuts, c.temperature, targets, want, g);
    const Logits got_grad =
        backward_sharded_gpu(gpu, x, dx, geometry, cuts, c.temperature, targets, want, g);
    expect_grad_equal(got_grad, want_grad, "gradient (all grads)");
    testing::GradInputs only_logp;
    only_logp.grad_logp = g.grad_logp;
    expect_grad_equal(
        backward_sharded_gpu(gpu, x, dx, geometry, cuts, c.temperature, targets, want, only_logp),
        testing::backward_sharded(cpu, x, geometry, cuts, c.temperature, targets, want, only_logp),
        "gradient (grad_logp only)");
  }
}

const DType kDtypes[] = {DType::bf16, DType::fp16, DType::fp32};

std::vector<RowKind> random_kinds() {
  return {RowKind::normal, RowKind::uniform50, RowKind::wide, RowKind::tiny_scale};
}

TEST(CudaKernels, RandomEveryDtypeTileWidthTemperature) {
  DETLOGP_REQUIRE_GPU();
  uint64_t stream = 1;
  for (DType d : kDtypes) {
    for (int64_t w : {128, 32, 64, 96, 1, 7, 200, 256}) {
      for (float tau : {1.0f, 0.7f}) {
        const int64_t real = 37 * w + 5;
        const int64_t padded = (real + w - 1) / w * w + 2 * w;
        check_case({d, 9, real, padded, w, padded + 3, tau, random_kinds(), 1, true, stream++});
      }
    }
  }
}

TEST(CudaKernels, AdversarialRowsEveryDtype) {
  DETLOGP_REQUIRE_GPU();
  uint64_t stream = 100;
  for (DType d : kDtypes) {
    for (int tp : {1, 2, 4}) {
      for (bool even : {true, false}) {
        // 16 row kinds, 2 rows each; a vocabulary of 23 full tiles and a partial one, padding.
        check_case({d, 32, 23 * 128 + 77, 26 * 128, 128, 26 * 128 + 8, 1.0f,
                    testing::all_row_kinds(), tp, even, stream++});
        check_case({d, 16, 300, 448, 64, -1, 1.5f, testing::all_row_kinds(), tp, even, stream++});
      }
    }
  }
}

TEST(CudaKernels, LargeNodesAndManyChunks) {
  DETLOGP_REQUIRE_GPU();
  // Nodes above the 256-tile chunk (binary counter across chunks), and W = 1 (one column per
  // tile, 2^12 leaves per row).
  check_case({DType::bf16, 6, 700 * 128 + 3, 704 * 128, 128, -1, 1.0f, random_kinds(), 1, true, 7});
  check_case({DType::fp32, 5, 4000, 4096, 1, -1, 1.0f, testing::all_row_kinds(), 1, true, 8});
  check_case({DType::fp16, 5, 4000, 4096, 1, -1, 0.5f, random_kinds(), 4, false, 9});
}

TEST(CudaKernels, Qwen3ShapedEveryDtype) {
  DETLOGP_REQUIRE_GPU();
  uint64_t stream = 300;
  for (DType d : kDtypes) {
    check_case({d, 24, 151936, 152064, 128, -1, 1.0f, random_kinds(), 1, true, stream++});
    check_case({d, 16, 151936, 152064, 128, -1, 1.0f, testing::all_row_kinds(), 2, true, stream++});
  }
}

// GPU forward at TP = 1, 2, 4 (padded size changing with TP, even and uneven cuts): identical
// LSE, entropy and logp bits, and identical to the reference at TP = 1.
TEST(CudaKernels, TensorParallelSplitsAgree) {
  DETLOGP_REQUIRE_GPU();
  const CudaShardKernels gpu;
  const TileGeometry geometry{151936, 128};
  for (DType d : kDtypes) {
    SCOPED_TRACE(std::string(to_string(d)));
    std::mt19937_64 rng(77);
    std::vector<int64_t> targets;
    const Logits x = testing::make_logits(d, 12, 152576, 151936, random_kinds(), rng, &targets);
    const DeviceLogits dx(x);
    const Logits x1 = testing::copy_rows(x, 0, x.rows);
    const std::vector<int64_t> cut1 = testing::make_cuts(151936, 128, 1, true, rng);
    const testing::ForwardResult ref =
        testing::forward_sharded(reference_kernels(), x1, geometry, cut1, 1.0f, true, targets);
    struct Split {
      int tp;
      int64_t padded;
      bool even;
    };
    for (const Split& s : {Split{1, 151936, true}, Split{2, 152064, true}, Split{4, 152576, true},
                           Split{2, 152064, false}, Split{4, 152576, false}}) {
      SCOPED_TRACE("tp=" + std::to_string(s.tp) + " padded=" + std::to_string(s.padded));
      const Logits xs = testing::copy_rows(x, 0, x.rows, 152576);  // same stride, fewer cols used
      Logits view_host = xs;
      view_host.cols = s.padded;
      const DeviceLogits dxs(view_host);
      const std::vector<int64_t> cuts = testing::make_cuts(s.padded, 128, s.tp, s.even, rng);
      const testing::ForwardResult got =
          forward_sharded_gpu(gpu, view_host, dxs, geometry, cuts, 1.0f, true, targets);
      EXPECT_EQ(bits_of(got.lse), bits_of(ref.lse));
      EXPECT_EQ(bits_of(got.entropy), bits_of(ref.entropy));
      EXPECT_EQ(bits_of(got.logp), bits_of(ref.logp));
    }
  }
}

// The operator over the CUDA kernels (device logits, in-process TP group on one GPU) against
// the operator over the reference kernels (host logits): logp, LSE, entropy, gradient.
TEST(CudaKernels, OperatorMatchesCpuAtTp124) {
  DETLOGP_REQUIRE_GPU();
  const VocabParallelLogprob gpu_op(cuda_kernels(), std::string(kCudaCanonicalBackendId));
  const VocabParallelLogprob cpu_op(reference_kernels(), "cpu-reference");
  const int64_t real = 5000, rows = 10, w = 128;
  for (DType d : kDtypes) {
    for (int tp : {1, 2, 4}) {
      SCOPED_TRACE(std::string(to_string(d)) + " tp=" + std::to_string(tp));
      const int64_t padded = (real + w * tp - 1) / (w * tp) * (w * tp);
      std::mt19937_64 rng(500 + tp);
      std::vector<int64_t> targets;
      const Logits x = testing::make_logits(d, rows, padded, real, random_kinds(), rng, &targets);
      const DeviceLogits dx(x);
      std::vector<VocabRange> bounds;
      for (int r = 0; r < tp; ++r)
        bounds.push_back(VocabRange{padded * r / tp, padded * (r + 1) / tp});
      std::vector<float> dlogp(static_cast<size_t>(rows), 0.5f),
          dlse(static_cast<size_t>(rows), -0.25f);
      for (bool on_gpu : {false, true}) {
        std::vector<LogprobResult> results(static_cast<size_t>(tp));
        Logits grad_host(d, rows, padded);
        DeviceLogits grad_dev(grad_host);
        run_ranks(tp, [&](Communicator& comm) {
          const int r = comm.rank();
          const VocabRange b = bounds[static_cast<size_t>(r)];
          const LogprobContract contract(
              {.role = Role::train,
               .dtype = d,
               .mask = MaskSpec::all_active(rows, -100),
               .sharding = ShardingSpec({.tp_rank = r,
                                         .tp_world_size = tp,
                                         .vocab_shard_bounds = bounds,
                                         .real_vocab_size = real,
                                         .padded_vocab_size = padded}),
               .reduction =
                   ReductionSpec({.determinism_scope = DeterminismScope::cross_tp_bitwise}),
               .temperature = 1.0f,
               .tile_width = w});
          const LogprobOp& op = on_gpu ? static_cast<const LogprobOp&>(gpu_op) : cpu_op;
          const LogitsView view =
              on_gpu ? dx.view_cols(b.start, b.size()) : x.view_cols(b.start, b.size());
          LogprobResult res = op.forward(view, targets, contract, comm, {.entropy = true});
          const MutableLogitsView g = on_gpu ? grad_dev.mutable_view_cols(b.start, b.size())
                                             : grad_host.mutable_view_cols(b.start, b.size());
          op.backward(res, {.grad_logp = dlogp, .grad_lse = dlse}, g);
          results[static_cast<size_t>(r)] = std::move(res);
        });
        static std::vector<LogprobResult> cpu_results;
        static Logits cpu_grad;
        if (!on_gpu) {
          cpu_results = std::move(results);
          cpu_grad = grad_host;
          continue;
        }
        const Logits gpu_grad = grad_dev.to_host();
        for (int r = 0; r < tp; ++r) {
          EXPECT_EQ(bits_of(results[r].logp), bits_of(cpu_results[r].logp)) << "rank " << r;
          EXPECT_EQ(bits_of(results[r].lse), bits_of(cpu_results[r].lse)) << "rank " << r;
          EXPECT_EQ(bits_of(results[r].entropy), bits_of(cpu_results[r].entropy)) << "rank " << r;
        }
        expect_grad_equal(gpu_grad, cpu_grad, "operator gradient");
      }
    }
  }
}

TEST(CudaKernels, RejectsHostPointers) {
  DETLOGP_REQUIRE_GPU();
  std::mt19937_64 rng(3);
  const Logits x = testing::make_logits(DType::fp32, 2, 256, 256, random_kinds(), rng);
  const TileGeometry geometry{256, 128};
  const ShardSpec spec{0, geometry, 1.0f};
  const std::vector<TreeNode> cover = canonical_cover(geometry, 0, 2);
  std::vector<NodePartial> out(2 * cover.size());
  EXPECT_THROW(cuda_kernels().node_partials(x.view(), spec, cover, false, out), ContractError);
}

// -------------------------------------------------------------------------------------------
// No device needed.

// det_exp_shift (the leaf kernel's exp) returns canon::det_exp's bits for every fp32 input: every
// float in [-88, 88.8] (where both compute; outside it both take the same early returns, also
// checked on a sample), on all hardware threads.
TEST(CudaBackendHost, ExpShiftEqualsCanonExhaustively) {
  struct Range {
    uint32_t begin, end;  // bit patterns [begin, end)
  };
  const Range ranges[] = {{0x00000000u, canon::bits_of(88.8f) + 1},
                          {0x80000000u, canon::bits_of(-88.0f) + 1}};
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<uint64_t> mismatches{0};
  std::atomic<uint32_t> first_bad{0};
  for (const Range& range : ranges) {
    std::vector<std::thread> pool;
    const uint64_t n = range.end - range.begin;
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const uint32_t b = static_cast<uint32_t>(range.begin + n * t / threads);
        const uint32_t e = static_cast<uint32_t>(range.begin + n * (t + 1) / threads);
        uint64_t bad = 0;
        for (uint32_t u = b; u < e; ++u) {
          const float x = canon::float_of(u);
          if (canon::bits_of(cuda_impl::det_exp_shift(x)) != canon::bits_of(canon::det_exp(x))) {
            if (bad++ == 0) first_bad = u;
          }
        }
        mismatches += bad;
      });
    }
    for (std::thread& th : pool) th.join();
  }
  EXPECT_EQ(mismatches.load(), 0u) << "first differing input bits 0x" << std::hex << first_bad;
  // Outside [-88, 88.8], NaNs and infinities: a stride through every other bit pattern.
  for (uint64_t u = 0; u <= 0xffffffffull; u += 65521) {
    const float x = canon::float_of(static_cast<uint32_t>(u));
    ASSERT_EQ(canon::bits_of(cuda_impl::det_exp_shift(x)), canon::bits_of(canon::det_exp(x)))
        << "x bits 0x" << std::hex << u;
  }
}

TEST(CudaBackendHost, CapabilityIsTheCanons) {
  const BackendCapability cap = cuda_capability();
  EXPECT_EQ(cap.backend_id(), kCudaCanonicalBackendId);
  EXPECT_EQ(cap.dtypes().size(), 3u);
  EXPECT_TRUE(cap.supports_vocab_padding());
  EXPECT_TRUE(cap.exports_vocab_lse());
  EXPECT_TRUE(cap.supports_temperature());
  EXPECT_EQ(cap.implementation_kind(), ImplementationKind::production);
}

// The CUDA kernels have no logit softcap: the capability does not declare it, dispatch on the
// cuda platform refuses a contract with a cap and names the reason (no fallback), and the
// kernels refuse a shard spec with one.
TEST(CudaBackendHost, SoftcapIsRefusedWithTheReason) {
  EXPECT_FALSE(cuda_capability().supports_softcap());
  Registry registry;
  register_cuda_backend(registry);
  const LogprobContract capped(
      {.role = Role::train,
       .dtype = DType::bf16,
       .mask = MaskSpec::all_active(4, -100),
       .sharding = ShardingSpec({.tp_rank = 0,
                                 .tp_world_size = 1,
                                 .vocab_shard_bounds = {VocabRange{0, 256}},
                                 .real_vocab_size = 200,
                                 .padded_vocab_size = 256}),
       .softcap = 30.0f});
  EXPECT_EQ(cuda_capability().incompatibilities(capped),
            std::vector<std::string>{"softcap=30 is unsupported"});
  try {
    registry.get_logprob_op(capped, "auto", "cuda");
    ADD_FAILURE() << "a softcap contract must not be served on cuda";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("softcap=30 is unsupported"), std::string::npos)
        << e.what();
  }
}

TEST(CudaBackendHost, RegisteredOnTheCudaPlatform) {
  Registry registry;
  register_cuda_backend(registry);
  const std::vector<std::string> names = registry.contract_candidates("cuda");
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0], kCudaCanonicalBackendName);
  EXPECT_TRUE(registry.contract_candidates("cpu").empty());
  const LogprobContract contract(
      {.role = Role::train,
       .dtype = DType::bf16,
       .mask = MaskSpec::all_active(4, -100),
       .sharding = ShardingSpec({.tp_rank = 0,
                                 .tp_world_size = 1,
                                 .vocab_shard_bounds = {VocabRange{0, 256}},
                                 .real_vocab_size = 200,
                                 .padded_vocab_size = 256}),
       .reduction = ReductionSpec({.determinism_scope = DeterminismScope::cross_tp_bitwise})});
  EXPECT_TRUE(cuda_capability().supports(contract));
  std::string why;
  if (cuda_device_count(&why) == 0) {
    // Truthful where there is no device: the factory fails, dispatch says so, never falls back.
    try {
      registry.get_logprob_op(contract, "auto", "cuda");
      ADD_FAILURE() << "dispatch on cuda without a device must throw";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(kCudaCanonicalBackendName), std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(registry.failed_to_load(kCudaCanonicalBackendName));
  } else {
    const DispatchResult d = registry.get_logprob_op(contract, "auto", "cuda");
    EXPECT_EQ(d.actual_backend, kCudaCanonicalBackendId);
    EXPECT_EQ(d.op->kernel_name().rfind("cuda:sm_", 0), 0u) << d.op->kernel_name();
  }
}

}  // namespace
}  // namespace detlogp
