// Operator benchmark under MPI, Qwen3-8B shapes, bf16:
//   - bytes each rank sends per forward (preflight record + payload) against its shard's bytes;
//   - preflight latency (median of repeated preflights);
//   - forward and backward wall time of the whole TP group.
// Run it as TP=1 with two threads and as TP=2 with one thread per rank:
//   mpirun -np 1 bench_operator_mpi --threads 2
//   mpirun -np 2 bench_operator_mpi --threads 1
// Rank 0 prints one JSON line.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "detlogp/detlogp.hpp"
#include "detlogp/mpi_comm.hpp"
#include "numerics/canon.hpp"
#include "op/preflight.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, tokens = 1024, reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::stoi(argv[i + 1]);
    if (a == "--tokens") tokens = std::stoi(argv[i + 1]);
    if (a == "--reps") reps = std::stoi(argv[i + 1]);
  }
  try {
    detlogp::MpiSession session(&argc, &argv);
    detlogp::MpiComm world = detlogp::MpiComm::world();
    const int tp = world.size(), rank = world.rank();
    const int64_t real = 151936;
    const detlogp::VocabLayout layout = detlogp::megatron_bounds(real, tp);
    const detlogp::VocabRange b = layout.vocab_shard_bounds[static_cast<std::size_t>(rank)];
    const int64_t rows = tokens;

    // This rank's shard of pseudo-random bf16 logits (LLM-like: N(0, 2) plus a few large logits).
    std::vector<uint16_t> shard(static_cast<std::size_t>(rows * b.size()));
    for (int64_t i = 0; i < rows; ++i) {
      std::mt19937 gen(static_cast<uint32_t>(i * 7919 + 1));
      std::normal_distribution<float> n(0.0f, 2.0f);
      for (int64_t c = 0; c < layout.padded_vocab_size; ++c) {
        const float v =
            c < real ? n(gen) + (c % 9973 == static_cast<int64_t>(i % 9973) ? 15.0f : 0.0f) : 0.0f;
        if (c >= b.start && c < b.end) {
          shard[static_cast<std::size_t>(i * b.size() + (c - b.start))] =
              detlogp::canon::float_to_bf16(v);
        }
      }
    }
    std::vector<int64_t> targets(static_cast<std::size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) targets[i] = (i * 104729) % real;

    detlogp::LogprobContract contract(
        {.role = detlogp::Role::train,
         .dtype = detlogp::DType::bf16,
         .mask = detlogp::MaskSpec::all_active(rows),
         .sharding = detlogp::ShardingSpec({.tp_rank = rank,
                                            .tp_world_size = tp,
                                            .vocab_shard_bounds = layout.vocab_shard_bounds,
                                            .real_vocab_size = real,
                                            .padded_vocab_size = layout.padded_vocab_size})});
    auto d = detlogp::get_logprob_op(contract, "production");
    const detlogp::LogitsView view{.data = shard.data(),
                                   .dtype = detlogp::DType::bf16,
                                   .rows = rows,
                                   .cols = b.size(),
                                   .row_stride = b.size()};
    std::vector<uint16_t> grad(shard.size());
    const detlogp::MutableLogitsView gview{.data = grad.data(),
                                           .dtype = detlogp::DType::bf16,
                                           .rows = rows,
                                           .cols = b.size(),
                                           .row_stride = b.size()};
    std::vector<float> g(static_cast<std::size_t>(rows), 1.0f);
    const detlogp::ForwardOptions opt{.exec = {.threads = threads}};

    std::vector<double> fwd, bwd, pre;
    for (int r = 0; r < reps + 1; ++r) {
      world.barrier();
      auto t0 = Clock::now();
      auto out = d.op->forward(view, targets, contract, world, opt);
      world.barrier();
      const double tf = seconds_since(t0);
      t0 = Clock::now();
      d.op->backward(out, {.grad_logp = g, .grad_lse = g}, gview);
      world.barrier();
      const double tb = seconds_since(t0);
      if (r > 0) {  // the first round warms up
        fwd.push_back(tf);
        bwd.push_back(tb);
      }
    }
    if (tp > 1) {
      detlogp::op::PreflightFacts facts;
      facts.fingerprint = contract.cross_rank_fingerprint();
      facts.backend_id = d.actual_backend;
      facts.numerics_version = std::string(detlogp::kNumericsVersion);
      facts.tile_width = contract.tile_width();
      facts.rows = rows;
      facts.local_begin = b.start / contract.tile_width();
      facts.local_end = (b.end + contract.tile_width() - 1) / contract.tile_width();
      for (int r = 0; r < 200; ++r) {
        world.barrier();
        const auto t0 = Clock::now();
        detlogp::op::run_preflight(world, facts);
        pre.push_back(seconds_since(t0));
      }
    }
    const detlogp::ForwardTraffic traffic = detlogp::VocabParallelLogprob::traffic(contract, true);
    const double shard_bytes = static_cast<double>(rows * b.size() * 2);
    if (rank == 0) {
      std::printf(
          "{\"tp\": %d, \"threads_per_rank\": %d, \"tokens\": %d, \"padded_vocab\": %lld, "
          "\"forward_s\": %.6f, \"backward_s\": %.6f, \"preflight_us\": %.2f, "
          "\"preflight_bytes_per_rank\": %lld, \"payload_bytes_per_rank_with_entropy\": %lld, "
          "\"shard_bytes\": %.0f, \"sent_fraction_of_shard\": %.6f, \"kernel\": \"%s\"}\n",
          tp, threads, tokens, static_cast<long long>(layout.padded_vocab_size), median(fwd),
          median(bwd), pre.empty() ? 0.0 : median(pre) * 1e6,
          static_cast<long long>(traffic.preflight_bytes_per_rank),
          static_cast<long long>(traffic.payload_bytes_per_rank), shard_bytes,
          (traffic.preflight_bytes_per_rank + traffic.payload_bytes_per_rank) / shard_bytes,
          d.op->kernel_name().c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_operator_mpi: %s\n", e.what());
    return 1;
  }
}
