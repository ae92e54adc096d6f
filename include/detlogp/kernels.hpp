#pragma once
// Shard-local kernels of the numerics canon (docs/numerics.md): no communication.
//
// A shard is the [rows, cols] block of logits one TP rank holds: global vocabulary columns
// [vocab_start, vocab_start + cols). The vocabulary is cut into tiles of W columns; a shard
// computes the partials (m, s, u) of the canonical-tree nodes covering its tiles, every rank
// rebuilds the same roots from everyone's nodes, and backward needs only the roots.
//
// Two implementations compute the same bits: the scalar reference (straight from the canon,
// slow) and the SIMD one (Google Highway, runtime dispatch, multithreaded). Neither keeps any
// buffer proportional to rows x vocab: no fp32 copy of the logits, no saved softmax.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "detlogp/dtype.hpp"
#include "detlogp/numerics.hpp"
#include "detlogp/views.hpp"  // LogitsView, MutableLogitsView

namespace detlogp {

// Where a shard sits in the vocabulary.
struct ShardSpec {
  int64_t vocab_start = 0;  // global column of local column 0; a multiple of W
  TileGeometry geometry = {};
  float temperature = 1.0f;  // z = fp32(x) / temperature
  // The logit softcap: 0 for none, else finite > 0 and z = (cap * det_tanh(x / cap)) /
  // temperature (docs/numerics.md "Softcap").
  float softcap = 0.0f;
  // Per-row temperatures: empty, or one finite value > 0 per shard row, which row r uses
  // instead of `temperature` (docs/numerics.md "Temperature"). The arithmetic and its rounding
  // points are the scalar temperature's: a row whose value equals `temperature` gets its bits.
  std::span<const float> row_temperature = {};

  // The divisor of row `row`.
  float temperature_of(int64_t row) const {
    return row_temperature.empty() ? temperature : row_temperature[static_cast<size_t>(row)];
  }
};

struct ExecOptions {
  int threads = 0;  // 0: all hardware threads. The bits never depend on it.
};

// Roots of a set of rows: LSE and entropy (fp32).
struct RootsOut {
  std::span<float> lse = {};      // [rows]
  std::span<float> entropy = {};  // [rows], or empty when entropy is not wanted
};

// Per-row inputs of the backward kernel.
struct BackwardInputs {
  std::span<const float> lse = {};             // [rows]
  std::span<const float> entropy = {};         // [rows]; needed when grad_entropy is given
  std::span<const int64_t> target_local = {};  // [rows]: local column of the target when the row
                                               // is active and this shard owns it, else -1
  std::span<const float> grad_logp = {};       // [rows] or empty (not supplied); inactive rows
                                               // must already be zero
  std::span<const float> grad_lse = {};        // [rows] or empty
  std::span<const float> grad_entropy = {};    // [rows] or empty
};

class ShardKernels {
 public:
  virtual ~ShardKernels() = default;

  // "scalar-reference", "highway:<TARGET>" for the SIMD implementation, or "cuda:sm_<XY>" for
  // the CUDA kernels.
  virtual std::string name() const = 0;

  // Whether backward and read_target_logits accept a shard whose vocab_start and end are not
  // multiples of W, and the shard lives in host memory (so that the logits op can complete
  // tiles split across ranks: op/boundary_fragments.hpp). The CPU kernels do; node_partials
  // always needs whole tiles.
  virtual bool supports_unaligned_bounds() const { return false; }

  // For every row and every node of `nodes` (tiles inside the shard, e.g. its canonical cover),
  // the node's partial: out[row * nodes.size() + j]. u is +0 unless with_entropy (a poisoned
  // partial, from a NaN or +inf logit, is (NaN, NaN, NaN) either way).
  virtual void node_partials(const LogitsView& shard, const ShardSpec& spec,
                             std::span<const TreeNode> nodes, bool with_entropy,
                             std::span<NodePartial> out, const ExecOptions& exec = {}) const = 0;

  // Rebuilds each row's root from node partials whose nodes together cover tiles [0, T)
  // exactly once (e.g. every rank's cover, concatenated): partials[row * nodes.size() + j].
  // Writes LSE (and entropy when `roots.entropy` is not empty).
  virtual void merge_roots(const TileGeometry& geometry, std::span<const TreeNode> nodes,
                           std::span<const NodePartial> partials, int64_t rows, RootsOut roots,
                           const ExecOptions& exec = {}) const = 0;

  // Gradient of the shard's logits, written in `grad.dtype` (== shard dtype), same shape.
  // Padding columns get exactly +0.
  virtual void backward(const LogitsView& shard, const ShardSpec& spec, const BackwardInputs& in,
                        const MutableLogitsView& grad, const ExecOptions& exec = {}) const = 0;

  // z of each row's target, as the free function read_target_logits below (which this default
  // calls: it reads host memory). A backend whose shard lives elsewhere (CUDA: device memory)
  // overrides it; the operator reads target logits through this member.
  virtual void read_target_logits(const LogitsView& shard, const ShardSpec& spec,
                                  std::span<const int64_t> target_local,
                                  std::span<float> out) const;

  // Whether the operator may run kept sets over these kernels (it then reads the kept scores
  // through read_target_logits and writes the kept gradient columns in host memory): true for
  // host-memory kernels; a backend whose shard lives elsewhere returns false, and a call with
  // kept sets is refused (docs/numerics.md "Kept sets").
  virtual bool supports_kept_sets() const { return true; }
};

// z of each row's target (fp32, softcapped, divided by the temperature) read from the shard, for
// rows whose target_local >= 0; other rows get +0.
void read_target_logits(const LogitsView& shard, const ShardSpec& spec,
                        std::span<const int64_t> target_local, std::span<float> out);

inline void ShardKernels::read_target_logits(const LogitsView& shard, const ShardSpec& spec,
                                             std::span<const int64_t> target_local,
                                             std::span<float> out) const {
  detlogp::read_target_logits(shard, spec, target_local, out);
}

// The fused lm_head's inputs on one rank, as its kernels see them: the hidden states and this
// rank's rows of the lm_head weight (docs/fused.md). The logits of a tile are never stored
// beyond one [row_block, W] block per thread.
struct FusedShard {
  LogitsView hidden;  // [rows, H]
  LogitsView weight;  // [local_vocab, H]: vocabulary rows [vocab_start, + local_vocab)
  // Global vocabulary row of weight row 0: a multiple of W, except where a kernel says so
  // (FusedKernels::supports_unaligned_bounds: grad_weight of a shard holding part of a tile).
  int64_t vocab_start = 0;
  TileGeometry geometry = {};
  float temperature = 1.0f;  // z = dot(hidden row, weight row) / temperature
  float softcap = 0.0f;      // 0: none; else the dot is softcapped before the temperature
  int64_t row_block = 96;    // rows per work block; the bits never depend on it
  // Per-row temperatures, as ShardSpec::row_temperature: empty, or one per hidden row.
  std::span<const float> row_temperature = {};

  // The divisor of row `row`.
  float temperature_of(int64_t row) const {
    return row_temperature.empty() ? temperature : row_temperature[static_cast<size_t>(row)];
  }
};

// The fused lm_head's kernels: the ShardKernels of a shard whose logits are computed tile by
// tile from hidden x weight (the canon's dot products, docs/numerics.md "Fused lm_head")
// instead of being read. Every implementation returns the same bits. No communication: the
// operator exchanges node partials and grad_hidden node sums and calls back for the roots.
class FusedKernels {
 public:
  virtual ~FusedKernels() = default;

  // "scalar-reference" or "highway:<TARGET>".
  virtual std::string name() const = 0;

  // The shard kernels of the same canon, whose merge_roots rebuilds the LSE and entropy.
  virtual const ShardKernels& shard_kernels() const = 0;

  // Whether the operator may run these kernels on shard bounds that split tiles across ranks
  // (op/boundary_fragments.hpp: the tile's owner computes it from the fragments' logits and, in
  // backward, weight rows, in host memory). Such kernels accept in `backward` without hidden sums a
  // shard that starts or ends inside a tile (grad_weight of those columns only, each a chain over
  // the tokens), and in read_target_logits, kept_backward and linear_logits any vocab_start. The
  // CPU kernels do.
  virtual bool supports_unaligned_bounds() const { return false; }

  // As ShardKernels::node_partials, for nodes inside the shard (e.g. its canonical cover):
  // out[row * nodes.size() + j].
  virtual void node_partials(const FusedShard& shard, std::span<const TreeNode> nodes,
                             bool with_entropy, std::span<NodePartial> out,
                             const ExecOptions& exec = {}) const = 0;

  // z of each row's target (one canonical dot, softcapped, divided by the temperature) for rows
  // whose target_local (a weight row) is >= 0; other rows get +0.
  virtual void read_target_logits(const FusedShard& shard, std::span<const int64_t> target_local,
                                  std::span<float> out) const = 0;

  // The gradients of the shard's nodes. grad_weight ([local_vocab, H], the weight's dtype or
  // fp32; skipped when its data is null): the sum over the tokens in token order, rounded once;
  // rows at or beyond the real vocabulary get +0. hidden_sums (skipped when empty): for each
  // node j the fp32 grad_hidden sum over its columns, [rows, H] at j * rows * H.
  virtual void backward(const FusedShard& shard, std::span<const TreeNode> nodes,
                        const BackwardInputs& in, const MutableLogitsView& grad_weight,
                        std::span<float> hidden_sums, const ExecOptions& exec = {}) const = 0;

  // backward over kept sets (docs/numerics.md "Kept sets"): `kept` holds each row's resolved
  // ids [rows, width] (ascending, -1 padded); `in` as for backward, with LSE and entropy over
  // the kept sets and grad_logp already +0 on rows without a target in their set. The logit
  // gradient of each kept column this shard holds, then the two chains over kept columns only:
  // grad_weight rows of kept ids (every other row +0) and each node's grad_hidden sum.
  virtual void kept_backward(const FusedShard& shard, std::span<const int64_t> kept, int64_t width,
                             std::span<const TreeNode> nodes, const BackwardInputs& in,
                             const MutableLogitsView& grad_weight,
                             std::span<float> hidden_sums) const = 0;

  // grad_hidden ([rows, H], input dtype or fp32) from node sums that cover tiles [0, T) exactly
  // once (every rank's nodes, concatenated): merged by the canonical tree, rounded once. With
  // no nodes it is +0. The sums are merged in place (their memory is overwritten).
  virtual void merge_hidden_sums(std::span<const TreeNode> nodes, std::span<float* const> sums,
                                 const MutableLogitsView& grad_hidden) const = 0;

  // out [rows, cols] fp32 = the canonical logits of hidden [rows, H] x weight [cols, H]
  // (padding rows included: a plain product).
  virtual void linear_logits(const LogitsView& hidden, const LogitsView& weight,
                             const MutableLogitsView& out, const ExecOptions& exec = {}) const = 0;
};

// The CPU fused kernels: "" or "simd" for the best SIMD target, "scalar-reference" (or
// "reference"), or a target such as "AVX2" / "highway:AVX2". Throws ContractError for a name
// this build or CPU does not offer.
const FusedKernels& fused_kernels_for(std::string_view kernel);

// The CPU fused kernels this build and CPU offer: "scalar-reference" and "highway:<TARGET>",
// best SIMD target first after the reference.
std::vector<std::string> fused_kernel_names();

// The scalar reference implementation.
const ShardKernels& reference_kernels();

// The SIMD implementation on the best target this CPU has.
const ShardKernels& simd_kernels();

// Every SIMD target compiled in and supported by this CPU, best first (e.g. "AVX3", "AVX2").
std::vector<std::string> simd_targets();

// The SIMD implementation pinned to one target from simd_targets(); throws std::runtime_error
// for a target this CPU cannot run.
const ShardKernels& simd_kernels_for(std::string_view target);

}  // namespace detlogp
