#pragma once
// The fused lm_head logprob: selected-token logprob, LSE and entropy straight from the hidden
// states and this rank's shard of the lm_head weight, without ever holding the logits (at most
// one tile of W logit columns per row block per thread). Bit for bit the same outputs as
// VocabParallelLogprob applied to the fp32 logits of linear_logits(hidden, weight_shard), on
// every rank, at every TP degree, thread count and SIMD target (docs/fused.md).
//
//   detlogp::FusedLinearLogprob op;                  // best SIMD target
//   auto out = op.forward(hidden, weight_shard, targets, contract, comm, {.entropy = true});
//   op.backward(out, {.grad_logp = dlogp}, grad_hidden, grad_weight_shard, comm);

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/kept_set.hpp"
#include "detlogp/kernels.hpp"
#include "detlogp/operator.hpp"

namespace detlogp {

// The canonical fp32 logits: out(i, c) = dot(hidden row i, weight row c) in the canon's order
// (16 interleaved fma lanes over the hidden dimension, then a fixed pairwise fold), for every
// row of `weight` (padding rows included: this is a plain product). hidden [rows, H] and weight
// [cols, H] in bf16, fp16 or fp32 (widened exactly); out [rows, cols] fp32. `kernel`: "" for
// the best SIMD target, "scalar-reference", or a name from fused_kernel_names(); every choice
// gives the same bits. This is the reference the fused operator is tested against.
void linear_logits(const LogitsView& hidden, const LogitsView& weight, const MutableLogitsView& out,
                   const ExecOptions& exec = {}, std::string_view kernel = {});

// fused_kernel_names() (detlogp/kernels.hpp) lists the kernels this build and CPU offer.

struct FusedOptions {
  bool validate = true;  // targets in the real vocabulary, finite LSE on active rows
  bool entropy = false;
  ExecOptions exec = {};
  // Rows of hidden states per work block (threads take (block, vocab node) items). The bits
  // never depend on it; it trades the per-thread working set (a few [row_block, H] buffers)
  // against the weight traffic (the weight is read once per row block). 96 is a whole number
  // of the kernels' register blocks (6 rows on AVX2, 4 on AVX-512) and of AVX2's 16-row lane
  // panels, and AVX2's dot tile packs each weight tile once per row block, so it needs rows:
  // at 32 the forward ran about 15% slower (docs/benchmarks.md).
  int64_t row_block = 96;
  // Per-row temperatures, as ForwardOptions::row_temperature: empty, or one finite value > 0
  // per row of the hidden states (the contract's temperature must then be 1). Copied.
  std::span<const float> row_temperature = {};
  // Sampling-replay kept sets, as ForwardOptions::kept (detlogp/kept_set.hpp): logp, LSE and
  // entropy over each row's kept set; backward's grad_weight has nonzero rows only for kept
  // ids, and grad_hidden sums over kept columns only. Copied.
  KeptSetOptions kept = {};
};

// What backward needs from forward (opaque): views of the hidden states and weight shard (never
// copies of the logits), LSE, entropy, the layout.
struct FusedSavedForward;

struct FusedLogprobResult {
  std::vector<float> logp;     // [tokens]; exactly 0.0 on inactive tokens
  std::vector<float> lse;      // [tokens]
  std::vector<float> entropy;  // [tokens] when requested
  // With kept sets: each row's ids ascending, -1 padded, [tokens, kept_width]; else empty, 0.
  std::vector<int64_t> kept_ids;
  int64_t kept_width = 0;
  std::shared_ptr<const FusedSavedForward> saved;
};

// Bytes each rank sends per call (the preflight record, then the payloads).
struct FusedTraffic {
  int64_t preflight_bytes_per_rank = 0;
  int64_t forward_payload_bytes_per_rank = 0;   // node partials + target logits
  int64_t backward_payload_bytes_per_rank = 0;  // grad_hidden node partials, fp32
  // Shard bounds that split tiles (0 when the bounds are tile-aligned): the boundary fragments'
  // fp32 logits in forward, their lm_head weight rows in backward (when grad_hidden is computed).
  int64_t forward_fragment_bytes_per_rank = 0;
  int64_t backward_fragment_bytes_per_rank = 0;
};

class FusedLinearLogprob {
 public:
  // `kernel` as for linear_logits: the CPU fused kernels of that name (fused_kernels_for). The
  // backend id travels in the cross-rank preflight.
  explicit FusedLinearLogprob(std::string_view kernel = {},
                              std::string backend_id = "cpu-fused-linear-logp");
  // Over any fused kernels (another backend's); they must outlive the op and its results.
  FusedLinearLogprob(const FusedKernels& kernels, std::string backend_id);

  const std::string& backend_id() const { return backend_id_; }
  std::string kernel_name() const;

  // hidden [tokens, H] and weight_shard [local_vocab, H] (rows of the contract's local range;
  // rows at or beyond the real vocabulary are never read), both in the contract dtype. Both
  // must stay alive and unchanged until backward is done with the result.
  FusedLogprobResult forward(const LogitsView& hidden, const LogitsView& weight_shard,
                             std::span<const int64_t> targets, const LogprobContract& contract,
                             Communicator& comm, const FusedOptions& options = {}) const;

  // grad_hidden [tokens, H]: the full gradient (the sum over the whole vocabulary, exchanged
  // over `comm`), identical on every rank. grad_weight [local_vocab, H]: this rank's shard's
  // gradient, a sum over the tokens in increasing token order; padding rows get +0. Each in
  // the input dtype or fp32 (rounded once from the fp32 sums); a view with null data skips
  // that gradient (grad_hidden must then be skipped on every rank alike). Collective whenever
  // grad_hidden is computed and TP > 1.
  void backward(const FusedLogprobResult& forward, const LogprobGrads& grads,
                const MutableLogitsView& grad_hidden, const MutableLogitsView& grad_weight,
                Communicator& comm) const;

  static FusedTraffic traffic(const LogprobContract& contract, int64_t hidden_size, bool entropy);

 private:
  // The backend id with the hidden size, as the preflight compares it.
  std::string backend_with_hidden(int64_t hidden_size) const;

  const FusedKernels* kernels_;
  std::string backend_id_;
};

}  // namespace detlogp
