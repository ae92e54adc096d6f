#pragma once
// The vocab-parallel selected-token logprob operator (docs/operator.md).
//
// Each TP rank passes its shard of the logits [tokens, local_vocab] and the target ids; every
// rank gets the same fp32 logp, LSE (and entropy) for every token, and backward gives each rank
// the gradient of its own shard in the logits dtype. One fixed-size preflight all-gather checks
// that the ranks agree before one all-gather moves the node partials and target logits.
//
//   auto out = op.forward(logits, targets, contract, comm, {.entropy = true});
//   op.backward(out, {.grad_logp = dlogp, .grad_lse = dlse}, grad_view);

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/contract.hpp"
#include "detlogp/kept_set.hpp"
#include "detlogp/kernels.hpp"

namespace detlogp {

struct ForwardOptions {
  // true: the canon (cross-TP bitwise). false: each shard reduced as one partial and ranks
  // merged in rank order; only with determinism_scope = fixed_topology.
  bool deterministic = true;
  // Check targets against the real vocabulary and the finiteness of active rows' LSE.
  // The cross-rank preflight runs whenever tp_world_size > 1, whatever this says.
  bool validate = true;
  bool entropy = false;  // also compute the entropy of softmax(z) over the real vocabulary
  // With entropy: whether backward may differentiate through it. false makes the entropy a
  // constant (a logged metric): forward keeps no copy of it for backward, and backward rejects
  // a grad_entropy with ContractError instead of silently dropping it. Changes no bits.
  bool entropy_grad = true;
  ExecOptions exec = {};
  // Which of the caller's tokens each row is, when the rows are not the tokens in order (a
  // binding that reads N-D logits through one 2-D view of its buffer: a permutation of the
  // leading dims, or rows between tokens that are masked out); empty: row i is token i. The
  // preflight compares it across ranks before anything else, so that ranks whose row i is a
  // different token fail together (ContractError ranks_disagree, field "rows_layout") instead
  // of merging partials of unrelated tokens. At most 63 characters (a longer text is cut).
  std::string rows_layout = {};
  // Per-row temperatures: empty (every row uses the contract's temperature), or one finite value
  // > 0 per row of the logits, which that row's scores are divided by instead (docs/numerics.md
  // "Temperature"); the contract's temperature must then be 1. Compared across ranks by the
  // preflight (ContractError ranks_disagree, field "temperature"). Copied: need not outlive the
  // call.
  std::span<const float> row_temperature = {};
  // Sampling-replay kept sets (detlogp/kept_set.hpp, docs/numerics.md "Kept sets"): when given,
  // logp, LSE and entropy are over each row's kept set S (logp = z[target] - LSE_S) and backward
  // writes gradients only into kept columns (+0 elsewhere). Always checked (ContractError, field
  // "kept_ids"), whatever `validate` says; compared across ranks by the preflight (ranks_disagree,
  // field "kept_ids"). Copied: need not outlive the call.
  KeptSetOptions kept = {};
};

// What backward needs from forward, kept by the LogprobResult (opaque).
struct SavedForward;

// Outputs of forward, replicated bitwise on every TP rank.
struct LogprobResult {
  std::vector<float> logp;     // [tokens] fp32; exactly 0.0 on inactive tokens
  std::vector<float> lse;      // [tokens] fp32; every token, inactive ones included
  std::vector<float> entropy;  // [tokens] fp32 when requested, else empty
  // With kept sets: each row's ids ascending, -1 padded, [tokens, kept_width]; else empty, 0.
  std::vector<int64_t> kept_ids;
  int64_t kept_width = 0;
  std::shared_ptr<const SavedForward> saved;  // for backward; holds a view of the logits
};

// The logits view a result's backward will read: the caller's own buffer, never a copy (a view
// with null data when the result holds no saved state).
LogitsView saved_logits(const LogprobResult& result);

// For a rank that cannot even call forward because its inputs failed checks of its own (for
// example in a language binding, before a view could be built): joins the preflight that the
// other ranks of `comm` run inside forward, so that each of them throws ContractError ("cross-rank
// preflight failed: rank R failed local validation: <message>") instead of waiting for this
// rank; then throws ContractError(message) here. With a communicator of one rank it just throws.
[[noreturn]] void fail_preflight(Communicator& comm, const std::string& message);

// For a rank whose call holds no tokens (an empty micro-batch, which no contract can describe:
// num_tokens > 0): joins the preflight that the other ranks of `comm` run inside forward, with
// zero rows. Returns only when every rank of `comm` has no tokens either (there is nothing to
// compute: the caller returns empty outputs, no further collective); when another rank has
// tokens, every rank throws ContractError ("cross-rank preflight failed: ranks disagree on the
// row count ..."). With a communicator of one rank it returns at once.
void preflight_no_tokens(Communicator& comm);

// The checks forward runs before it looks at the communicator, in forward's order: the mode
// (tile alignment, or deterministic=false against cross_tp_bitwise), then the logits' and
// targets' shapes and dtype against the contract. Throws the ContractError forward would. For
// a language binding that cannot build a communicator (no process group): it reports these
// problems first, as forward does, before its own transport error.
void check_forward_inputs(const LogitsView& local_logits, std::span<const int64_t> targets,
                          const LogprobContract& contract, const ForwardOptions& options = {});

// Incoming gradients (fp32, one per token); an empty span means "not supplied".
struct LogprobGrads {
  std::span<const float> grad_logp = {};
  std::span<const float> grad_lse = {};
  std::span<const float> grad_entropy = {};
};

// Bytes one forward moves, for benchmarks and docs.
struct ForwardTraffic {
  int64_t preflight_bytes_per_rank = 0;
  int64_t payload_bytes_per_rank = 0;
  // The boundary fragments of tiles split by unaligned shard bounds (deterministic mode): one
  // all-gather before the node partials; 0 when the bounds are tile-aligned.
  int64_t fragment_bytes_per_rank = 0;
};

// A logprob backend: what the registry hands out.
class LogprobOp {
 public:
  virtual ~LogprobOp() = default;
  virtual const std::string& backend_id() const = 0;
  // Name of the kernels that run (e.g. "highway:AVX3", "scalar-reference").
  virtual std::string kernel_name() const = 0;
  // The shard kernels forward runs the canon with, for callers that scan the same shard
  // (the sampler, detlogp/sampler.hpp); null for an op that is not the canon over ShardKernels.
  virtual const ShardKernels* shard_kernels() const { return nullptr; }

  // `local_logits` must stay alive and unchanged until backward is done with the result.
  virtual LogprobResult forward(const LogitsView& local_logits, std::span<const int64_t> targets,
                                const LogprobContract& contract, Communicator& comm,
                                const ForwardOptions& options = {}) const = 0;

  // Gradient of this rank's logits shard; `grad` has the shard's shape and dtype. No collective.
  virtual void backward(const LogprobResult& forward, const LogprobGrads& grads,
                        const MutableLogitsView& grad) const = 0;
};

// The canonical vocab-parallel operator over a set of shard kernels.
class VocabParallelLogprob final : public LogprobOp {
 public:
  VocabParallelLogprob(const ShardKernels& kernels, std::string backend_id);

  const std::string& backend_id() const override { return backend_id_; }
  std::string kernel_name() const override { return kernels_.name(); }
  const ShardKernels* shard_kernels() const override { return &kernels_; }

  LogprobResult forward(const LogitsView& local_logits, std::span<const int64_t> targets,
                        const LogprobContract& contract, Communicator& comm,
                        const ForwardOptions& options = {}) const override;

  void backward(const LogprobResult& forward, const LogprobGrads& grads,
                const MutableLogitsView& grad) const override;

  // Bytes each rank sends in one forward of this contract (preflight + payload).
  static ForwardTraffic traffic(const LogprobContract& contract, bool deterministic);

 private:
  LogprobResult forward_kept(const LogitsView& local_logits, std::span<const int64_t> targets,
                             const LogprobContract& contract, Communicator& comm,
                             const ForwardOptions& options, std::shared_ptr<SavedForward> saved,
                             const LogprobResult* full) const;

  const ShardKernels& kernels_;
  std::string backend_id_;
};

// The single-shard batch-invariant logprob (no vocabulary parallelism): per row an fp32
// max, a left-to-right sum of exp(z - max) and a log, in an order fixed by the vocabulary width
// alone. Not the canon (its bits differ from VocabParallelLogprob's), TP = 1 only, no entropy;
// its capability says so (fixed_topology only, no padding, no LSE export).
class BatchInvariantLogprob final : public LogprobOp {
 public:
  explicit BatchInvariantLogprob(std::string backend_id);
  const std::string& backend_id() const override { return backend_id_; }
  std::string kernel_name() const override { return "scalar-batch-invariant"; }
  LogprobResult forward(const LogitsView& local_logits, std::span<const int64_t> targets,
                        const LogprobContract& contract, Communicator& comm,
                        const ForwardOptions& options = {}) const override;
  void backward(const LogprobResult& forward, const LogprobGrads& grads,
                const MutableLogitsView& grad) const override;

 private:
  std::string backend_id_;
};

}  // namespace detlogp
