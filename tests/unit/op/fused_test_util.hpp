#pragma once
// Helpers for the fused lm_head tests: hidden states and lm_head weights in any dtype, a TP run
// of FusedLinearLogprob over an in-process group that joins every rank's gradients, and the
// fp32 logits of linear_logits.

#include <cstdint>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/fused.hpp"
#include "op_test_util.hpp"

namespace detlogp::testing {

// A [rows, cols] matrix in `dtype` made from Gaussian fp32 values * scale narrowed with the canon's
// rounding: the logits generator with no padding columns.
inline FullLogits make_matrix(DType dtype, int64_t rows, int64_t cols, uint32_t salt, float scale) {
  return make_logits(dtype, rows, cols, cols, salt, scale);
}

// The exact fp32 upcast of a matrix.
inline FullLogits upcast(const FullLogits& m) {
  FullLogits out;
  out.dtype = DType::fp32;
  out.rows = m.rows;
  out.cols = m.cols;
  out.f32.resize(static_cast<std::size_t>(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) out.f32[r * m.cols + c] = m.at(r, c);
  }
  return out;
}

inline LogitsView whole(const FullLogits& m) { return m.shard(0, m.cols); }

// Rows [begin, end) of a matrix as a view.
inline LogitsView row_range(const FullLogits& m, int64_t begin, int64_t end) {
  return LogitsView{
      .data = static_cast<const char*>(m.data()) + begin * m.cols * dtype_size(m.dtype),
      .dtype = m.dtype,
      .rows = end - begin,
      .cols = m.cols,
      .row_stride = m.cols};
}

// linear_logits(hidden, weight) as a FullLogits of fp32.
inline FullLogits logits_of(const FullLogits& hidden, const FullLogits& weight,
                            std::string_view kernel = {}) {
  FullLogits z;
  z.dtype = DType::fp32;
  z.rows = hidden.rows;
  z.cols = weight.rows;
  z.f32.assign(static_cast<std::size_t>(z.rows * z.cols), 0.0f);
  linear_logits(whole(hidden),
                LogitsView{.data = weight.data(),
                           .dtype = weight.dtype,
                           .rows = weight.rows,
                           .cols = weight.cols,
                           .row_stride = weight.cols},
                MutableLogitsView{.data = z.f32.data(),
                                  .dtype = DType::fp32,
                                  .rows = z.rows,
                                  .cols = z.cols,
                                  .row_stride = z.cols},
                {}, kernel);
  return z;
}

struct FusedRun {
  std::vector<FusedLogprobResult> ranks;
  std::vector<std::vector<float>> grad_hidden;  // per rank, [rows, H] fp32
  std::vector<float> grad_weight;               // [padded, H] fp32, shards joined
};

struct FusedRunOptions {
  std::string kernel = {};
  FusedOptions fused = {};
  GradInputs grads = {};
  bool backward = true;
  // Gradients written in the inputs' dtype (rounded once by the op), widened exactly into the
  // run's fp32 vectors; else written in fp32.
  bool grads_in_input_dtype = false;
};

// A gradient buffer of `n` values in `dtype` (fp32 values, or bf16/fp16 bits) and its widening.
struct GradBuffer {
  DType dtype = DType::fp32;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  GradBuffer(DType d, std::size_t n) : dtype(d) {
    if (d == DType::fp32) {
      f32.assign(n, -1.0f);
    } else {
      half.assign(n, 0xbf80);  // -1 in bf16
    }
  }
  void* at(std::size_t i) {
    return dtype == DType::fp32 ? static_cast<void*>(f32.data() + i)
                                : static_cast<void*>(half.data() + i);
  }
  std::vector<float> widened() const {
    if (dtype == DType::fp32) return f32;
    std::vector<float> out(half.size());
    for (std::size_t i = 0; i < half.size(); ++i) {
      out[i] = dtype == DType::bf16 ? canon::bf16_to_float(half[i]) : canon::fp16_to_float(half[i]);
    }
    return out;
  }
};

// `weight` holds all [padded, H] rows; each rank passes its shard's rows.
inline FusedRun run_fused(const FullLogits& hidden, const FullLogits& weight, const Layout& layout,
                          const std::vector<int64_t>& targets, const ContractOptions& copt,
                          const FusedRunOptions& o) {
  const int tp = static_cast<int>(layout.bounds.size());
  const int64_t hs = hidden.cols;
  const DType gdt = o.grads_in_input_dtype ? hidden.dtype : DType::fp32;
  FusedRun run;
  run.ranks.resize(static_cast<std::size_t>(tp));
  run.grad_hidden.resize(static_cast<std::size_t>(tp));
  GradBuffer gw(gdt, static_cast<std::size_t>(weight.rows * hs));
  const FusedLinearLogprob op(o.kernel);
  run_ranks(tp, [&](Communicator& comm) {
    const int r = comm.rank();
    const VocabRange b = layout.bounds[static_cast<std::size_t>(r)];
    ContractOptions c = copt;
    c.dtype = hidden.dtype;
    const LogprobContract contract = make_contract(layout, r, hidden.rows, c);
    FusedLogprobResult res = op.forward(whole(hidden), row_range(weight, b.start, b.end), targets,
                                        contract, comm, o.fused);
    if (o.backward) {
      GradBuffer gh(gdt, static_cast<std::size_t>(hidden.rows * hs));
      op.backward(
          res,
          {.grad_logp = o.grads.grad_logp,
           .grad_lse = o.grads.grad_lse,
           .grad_entropy = o.grads.grad_entropy},
          MutableLogitsView{
              .data = gh.at(0), .dtype = gdt, .rows = hidden.rows, .cols = hs, .row_stride = hs},
          MutableLogitsView{.data = gw.at(static_cast<std::size_t>(b.start * hs)),
                            .dtype = gdt,
                            .rows = b.size(),
                            .cols = hs,
                            .row_stride = hs},
          comm);
      run.grad_hidden[static_cast<std::size_t>(r)] = gh.widened();
    }
    run.ranks[static_cast<std::size_t>(r)] = std::move(res);
  });
  run.grad_weight = gw.widened();
  return run;
}

// Tile-aligned layouts of `real` columns over tp ranks: even shards padded to W * tp (the
// padded size changes with tp), or uneven tile-aligned bounds.
inline Layout padded_layout(int64_t real, int tp, int64_t w) {
  const int64_t unit = w * tp;
  const int64_t padded = (real + unit - 1) / unit * unit;
  Layout l{.real = real, .padded = padded};
  for (int r = 0; r < tp; ++r)
    l.bounds.push_back(VocabRange{padded / tp * r, padded / tp * (r + 1)});
  return l;
}

inline Layout uneven_layout(int64_t real, const std::vector<int64_t>& tiles_per_rank, int64_t w) {
  Layout l{.real = real};
  int64_t at = 0;
  for (int64_t t : tiles_per_rank) {
    l.bounds.push_back(VocabRange{at, at + t * w});
    at += t * w;
  }
  l.padded = at;
  return l;
}

}  // namespace detlogp::testing
