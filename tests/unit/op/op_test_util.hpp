#pragma once
// Helpers for operator tests: full logits matrices in any dtype, contracts for a TP layout, and
// a runner that plays every TP rank on an in-process group and collects every rank's outputs.

#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/operator.hpp"
#include "numerics/canon.hpp"

namespace detlogp::testing {

// A [rows, padded] matrix of logits stored in `dtype` (bf16/fp16 as raw uint16 bits).
struct FullLogits {
  DType dtype = DType::fp32;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> f32;      // used when dtype == fp32
  std::vector<uint16_t> half;  // used for bf16 / fp16

  const void* data() const {
    return dtype == DType::fp32 ? static_cast<const void*>(f32.data()) : half.data();
  }
  float at(int64_t r, int64_t c) const {
    const std::size_t i = static_cast<std::size_t>(r * cols + c);
    switch (dtype) {
      case DType::fp32:
        return f32[i];
      case DType::bf16:
        return canon::bf16_to_float(half[i]);
      case DType::fp16:
        return canon::fp16_to_float(half[i]);
    }
    return 0.0f;
  }
  // Columns [start, end) of every row, as a strided view into this matrix.
  LogitsView shard(int64_t start, int64_t end) const {
    const std::size_t esz = dtype_size(dtype);
    return LogitsView{.data = static_cast<const char*>(data()) + start * esz,
                      .dtype = dtype,
                      .rows = rows,
                      .cols = end - start,
                      .row_stride = cols};
  }
};

// Gaussian logits * scale in the real columns; `padding_value` in columns >= real.
inline FullLogits make_logits(DType dtype, int64_t rows, int64_t real, int64_t padded,
                              uint32_t stream, float scale = 3.0f, float padding_value = 1e4f) {
  std::mt19937 gen(stream);
  std::normal_distribution<float> normal(0.0f, scale);
  FullLogits out;
  out.dtype = dtype;
  out.rows = rows;
  out.cols = padded;
  std::vector<float> values(static_cast<std::size_t>(rows * padded));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < padded; ++c) {
      values[r * padded + c] = c < real ? normal(gen) : padding_value;
    }
  }
  if (dtype == DType::fp32) {
    out.f32 = std::move(values);
  } else {
    out.half.resize(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      out.half[i] =
          dtype == DType::bf16 ? canon::float_to_bf16(values[i]) : canon::float_to_fp16(values[i]);
    }
  }
  return out;
}

struct Layout {
  int64_t real = 0;
  int64_t padded = 0;
  std::vector<VocabRange> bounds = {};
};

struct ContractOptions {
  DType dtype = DType::fp32;
  std::vector<bool> active = {};  // empty: all active
  DeterminismScope scope = DeterminismScope::cross_tp_bitwise;
  std::optional<int64_t> tile_width = std::nullopt;
  float temperature = 1.0f;
  int64_t ignore_index = -100;
  std::optional<float> softcap = std::nullopt;
};

inline LogprobContract make_contract(const Layout& layout, int64_t rank, int64_t rows,
                                     const ContractOptions& o) {
  MaskSpec mask =
      o.active.empty()
          ? MaskSpec::all_active(rows, o.ignore_index)
          : MaskSpec({.num_tokens = rows, .active_mask = o.active, .ignore_index = o.ignore_index});
  ShardingSpec sharding({.tp_rank = rank,
                         .tp_world_size = static_cast<int64_t>(layout.bounds.size()),
                         .vocab_shard_bounds = layout.bounds,
                         .real_vocab_size = layout.real,
                         .padded_vocab_size = layout.padded});
  ReductionSpec reduction({.determinism_scope = o.scope});
  return LogprobContract({.role = Role::train,
                          .dtype = o.dtype,
                          .mask = mask,
                          .sharding = sharding,
                          .reduction = reduction,
                          .temperature = o.temperature,
                          .softcap = o.softcap,
                          .tile_width = o.tile_width});
}

// Every rank's outputs of one forward (+ backward) over an in-process group.
struct RankOutputs {
  LogprobResult result;
};

struct TpRun {
  std::vector<RankOutputs> ranks;  // by TP rank
  FullLogits grad;                 // the full gradient, shards joined in vocab order
};

struct GradInputs {
  std::vector<float> grad_logp = {};  // empty: not supplied
  std::vector<float> grad_lse = {};
  std::vector<float> grad_entropy = {};
};

// Runs forward (and backward when `grads` supplies anything) on every rank of a TP group.
inline TpRun run_tp(const LogprobOp& op, const FullLogits& logits, const Layout& layout,
                    const std::vector<int64_t>& targets, const ContractOptions& copt,
                    const ForwardOptions& fopt, const GradInputs& grads) {
  const int tp = static_cast<int>(layout.bounds.size());
  TpRun run;
  run.ranks.resize(static_cast<std::size_t>(tp));
  run.grad.dtype = logits.dtype;
  run.grad.rows = logits.rows;
  run.grad.cols = logits.cols;
  if (logits.dtype == DType::fp32) {
    run.grad.f32.assign(logits.f32.size(), 0.0f);
  } else {
    run.grad.half.assign(logits.half.size(), 0);
  }
  const bool any_grad =
      !grads.grad_logp.empty() || !grads.grad_lse.empty() || !grads.grad_entropy.empty();
  run_ranks(tp, [&](Communicator& comm) {
    const int r = comm.rank();
    const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
    LogprobContract contract = make_contract(layout, r, logits.rows, copt);
    LogprobResult res = op.forward(logits.shard(b.start, b.end), targets, contract, comm, fopt);
    if (any_grad) {
      const std::size_t esz = dtype_size(logits.dtype);
      void* base = logits.dtype == DType::fp32 ? static_cast<void*>(run.grad.f32.data())
                                               : static_cast<void*>(run.grad.half.data());
      MutableLogitsView g{.data = static_cast<char*>(base) + b.start * esz,
                          .dtype = logits.dtype,
                          .rows = logits.rows,
                          .cols = b.size(),
                          .row_stride = logits.cols};
      op.backward(res,
                  {.grad_logp = grads.grad_logp,
                   .grad_lse = grads.grad_lse,
                   .grad_entropy = grads.grad_entropy},
                  g);
    }
    run.ranks[static_cast<std::size_t>(r)].result = std::move(res);
  });
  return run;
}

// Each rank's exception message ("" if none) when body(comm) runs on `ranks` in-process ranks
// (30 s collective timeout); `finished` is false when they were not all done within 60 s.
struct RankErrors {
  std::vector<std::string> errors;
  bool finished = false;
};
inline RankErrors rank_errors(int ranks, const std::function<void(Communicator&)>& body) {
  RankErrors out{std::vector<std::string>(static_cast<std::size_t>(ranks)), false};
  auto fut = std::async(std::launch::async, [&] {
    InProcessGroup group(ranks, {.collective_timeout = std::chrono::seconds(30)});
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        try {
          body(group.comm(r));
        } catch (const std::exception& e) {
          out.errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
  });
  out.finished = fut.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  fut.wait();
  return out;
}

inline std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> out(v.size());
  if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

// Raw bytes of the real-vocabulary columns of a gradient (row-major).
inline std::vector<uint8_t> real_grad_bytes(const FullLogits& g, int64_t real) {
  const std::size_t esz = dtype_size(g.dtype);
  const auto* base = static_cast<const uint8_t*>(g.data());
  std::vector<uint8_t> out;
  for (int64_t r = 0; r < g.rows; ++r) {
    const uint8_t* row = base + r * g.cols * esz;
    out.insert(out.end(), row, row + real * esz);
  }
  return out;
}

}  // namespace detlogp::testing
