// The SIMD implementation of the shard-local kernels (include/detlogp/kernels.hpp): argument
// checks, threads and the ShardKernels objects; the per-target arithmetic is in
// simd_targets.cpp.
//
// Threads split rows into contiguous blocks. A row's bits depend only on that row (its leaves,
// tree and gradient are computed by one thread, in the canon's order), so no result depends on
// the thread count. No mutable global state: each target's kernels object is built once and is
// immutable.
#include <algorithm>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "detlogp/kernels.hpp"
#include "kernels/common/validate.hpp"
#include "kernels/cpu/simd/simd_kernels.hpp"
#include "numerics/canon.hpp"
#include "numerics/root_program.hpp"

namespace detlogp {
namespace {

// Below this many elements per thread, extra threads cost more than they save.
constexpr int64_t kMinElementsPerThread = int64_t{1} << 16;
// More threads than this are never started, whatever ExecOptions asks for.
constexpr int64_t kMaxThreads = 256;
// Gradients larger than this are written with non-temporal stores (they would only evict the
// logits and cost a read-for-ownership).
constexpr int64_t kStreamBytes = int64_t{32} << 20;

simd::ShardJob shard_job(const LogitsView& shard, const ShardSpec& spec) {
  return simd::ShardJob{.data = shard.data,
                        .dtype = shard.dtype,
                        .row_stride = shard.row_stride,
                        .cols = shard.cols,
                        .vocab_start = spec.vocab_start,
                        .geometry = spec.geometry,
                        .temperature = spec.temperature,
                        .softcap = spec.softcap};
}

// Runs a target's row function over rows [begin, end) of `job`. With per-row temperatures, each
// run of consecutive rows sharing one temperature is a job of its own with that scalar
// temperature: the scalar path's arithmetic, row by row.
template <class Job>
void rows_with_temperature(void (*fn)(const Job&, int64_t, int64_t), const Job& job,
                           std::span<const float> row_temperature, int64_t begin, int64_t end) {
  if (row_temperature.empty()) {
    fn(job, begin, end);
    return;
  }
  Job run = job;
  for (int64_t r = begin; r < end;) {
    const float t = row_temperature[static_cast<size_t>(r)];
    int64_t run_end = r + 1;
    while (run_end < end && row_temperature[static_cast<size_t>(run_end)] == t) ++run_end;
    run.temperature = t;
    fn(run, r, run_end);
    r = run_end;
  }
}

int thread_count(const ExecOptions& exec, int64_t rows, int64_t elements_per_row) {
  int64_t threads = exec.threads > 0 ? exec.threads : std::thread::hardware_concurrency();
  if (threads < 1) threads = 1;
  threads = std::min<int64_t>(threads, kMaxThreads);
  threads = std::min(threads, rows);
  const int64_t total = rows * std::max<int64_t>(elements_per_row, 1);
  threads = std::min(threads, std::max<int64_t>(total / kMinElementsPerThread, 1));
  return static_cast<int>(std::max<int64_t>(threads, 1));
}

// Runs fn(row_begin, row_end) over [0, rows) on `threads` threads (the caller's among them).
template <class Fn>
void parallel_rows(int64_t rows, int threads, const Fn& fn) {
  if (threads <= 1 || rows <= 1) {
    if (rows > 0) fn(int64_t{0}, rows);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  auto run = [&](int t) {
    const int64_t begin = rows * t / threads;
    const int64_t end = rows * (t + 1) / threads;
    try {
      if (begin < end) fn(begin, end);
    } catch (...) {
      errors[static_cast<size_t>(t)] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));
  // A thread that cannot be started (resource limits) runs its block on the calling thread
  // instead: the blocks, and so the bits, stay the same.
  std::vector<int> inline_blocks;
  for (int t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(run, t);
    } catch (const std::system_error&) {
      inline_blocks.push_back(t);
    }
  }
  run(0);
  for (int t : inline_blocks) run(t);
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

class HighwayKernels final : public ShardKernels {
 public:
  explicit HighwayKernels(const simd::TargetOps& ops) : ops_(ops) {}

  std::string name() const override { return std::string("highway:") + ops_.name; }
  bool supports_unaligned_bounds() const override { return true; }

  void node_partials(const LogitsView& shard, const ShardSpec& spec,
                     std::span<const TreeNode> nodes, bool with_entropy, std::span<NodePartial> out,
                     const ExecOptions& exec) const override {
    kernels::validate_node_partials(shard, spec, nodes, out);
    if (shard.rows == 0 || nodes.empty()) return;
    simd::NodePartialsJob job;
    static_cast<simd::ShardJob&>(job) = shard_job(shard, spec);
    job.nodes = nodes.data();
    job.num_nodes = static_cast<int64_t>(nodes.size());
    job.with_entropy = with_entropy;
    job.out = out.data();
    const int threads = thread_count(exec, shard.rows, shard.cols);
    const auto fn = ops_.node_partials_rows;
    parallel_rows(shard.rows, threads, [&](int64_t b, int64_t e) {
      rows_with_temperature(fn, job, spec.row_temperature, b, e);
    });
  }

  void merge_roots(const TileGeometry& geometry, std::span<const TreeNode> nodes,
                   std::span<const NodePartial> partials, int64_t rows, RootsOut roots,
                   const ExecOptions& exec) const override {
    kernels::validate_merge_roots(geometry, nodes, partials, rows, roots);
    if (rows == 0) return;
    const numerics::RootProgram program(geometry, nodes);
    const std::span<const int32_t> ops = program.ops();
    const auto num_ops = static_cast<int64_t>(ops.size());
    const bool with_entropy = !roots.entropy.empty();
    const size_t stride = nodes.size();
    const int threads = thread_count(exec, rows, static_cast<int64_t>(stride) * 256);
    parallel_rows(rows, threads, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const NodePartial* row = partials.data() + static_cast<size_t>(r) * stride;
        const canon::Partial root =
            with_entropy ? numerics::run_root_program<true>(ops.data(), num_ops, row)
                         : numerics::run_root_program<false>(ops.data(), num_ops, row);
        const canon::RootValues v = canon::finish_root(root);
        roots.lse[static_cast<size_t>(r)] = v.lse;
        if (with_entropy) roots.entropy[static_cast<size_t>(r)] = v.entropy;
      }
    });
  }

  void backward(const LogitsView& shard, const ShardSpec& spec, const BackwardInputs& in,
                const MutableLogitsView& grad, const ExecOptions& exec) const override {
    kernels::validate_backward(shard, spec, in, grad, kernels::ShardBounds::any_bounds);
    if (shard.rows == 0 || shard.cols == 0) return;
    simd::BackwardJob job;
    static_cast<simd::ShardJob&>(job) = shard_job(shard, spec);
    job.lse = in.lse.data();
    job.entropy = in.grad_entropy.empty() ? nullptr : in.entropy.data();
    job.target_local = in.target_local.data();
    job.grad_logp = in.grad_logp.empty() ? nullptr : in.grad_logp.data();
    job.grad_lse = in.grad_lse.empty() ? nullptr : in.grad_lse.data();
    job.grad_entropy = in.grad_entropy.empty() ? nullptr : in.grad_entropy.data();
    job.grad = grad.data;
    job.grad_row_stride = grad.row_stride;
    job.stream_stores =
        shard.rows * shard.cols * static_cast<int64_t>(dtype_size(shard.dtype)) >= kStreamBytes;
    const int threads = thread_count(exec, shard.rows, shard.cols);
    const auto fn = ops_.backward_rows;
    parallel_rows(shard.rows, threads, [&](int64_t b, int64_t e) {
      rows_with_temperature(fn, job, spec.row_temperature, b, e);
    });
  }

 private:
  simd::TargetOps ops_;
};

// Every supported target's kernels, best first; built once, immutable afterwards.
const std::vector<std::unique_ptr<HighwayKernels>>& all_kernels() {
  static const std::vector<std::unique_ptr<HighwayKernels>> kernels = [] {
    std::vector<std::unique_ptr<HighwayKernels>> v;
    for (const simd::TargetOps& ops : simd::supported_target_ops()) {
      v.push_back(std::make_unique<HighwayKernels>(ops));
    }
    if (v.empty()) throw std::runtime_error("detlogp: no Highway SIMD target is available");
    return v;
  }();
  return kernels;
}

}  // namespace

const ShardKernels& simd_kernels() { return *all_kernels().front(); }

std::vector<std::string> simd_targets() {
  std::vector<std::string> names;
  for (const simd::TargetOps& ops : simd::supported_target_ops()) names.emplace_back(ops.name);
  return names;
}

const ShardKernels& simd_kernels_for(std::string_view target) {
  for (const auto& k : all_kernels()) {
    if (k->name() == std::string("highway:") + std::string(target)) return *k;
  }
  std::string known;
  for (const std::string& t : simd_targets()) known += (known.empty() ? "" : ", ") + t;
  throw std::runtime_error("detlogp: SIMD target '" + std::string(target) +
                           "' is not available on this CPU (available: " + known + ")");
}

}  // namespace detlogp
