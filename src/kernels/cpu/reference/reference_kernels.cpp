// The scalar reference kernels: docs/numerics.md written out literally, one row, one
// node, one column at a time, single-threaded. Every floating-point operation is a call into
// numerics/canon.hpp; this file only decides which values go in, in which order:
//
//   leaf(t)            the tile's real columns, widened, softcapped, divided by tau,
//                      canon::leaf_partial
//   value(level, i)    leaf(i) at level 0, identity for tiles at or beyond T,
//                      else canon::merge(value(level-1, 2i), value(level-1, 2i+1))
//   root               rebuilt from given nodes by the same recursion (numerics/root_program.hpp),
//                      canon::finish_root
//   gradient           canon::grad_of_logit per real column, +0 on padding, narrowed
//
// The SIMD kernels are tested bitwise against this file.
#include <vector>

#include "detlogp/errors.hpp"
#include "detlogp/kernels.hpp"
#include "kernels/common/grad_coefficients.hpp"
#include "kernels/common/validate.hpp"
#include "numerics/canon.hpp"
#include "numerics/element_io.hpp"
#include "numerics/root_program.hpp"

namespace detlogp {

namespace {

// One row of a shard: z of a global column, and the leaf partial of a tile.
class ShardRow {
 public:
  ShardRow(const LogitsView& shard, const ShardSpec& spec, int64_t row)
      : shard_(shard),
        spec_(spec),
        row_offset_(row * shard.row_stride),
        temperature_(spec.temperature_of(row)) {}

  // The widened logit x of a real global column held by the shard.
  float x(int64_t global_col) const {
    return numerics::load_as_float(shard_.data, shard_.dtype,
                                   row_offset_ + global_col - spec_.vocab_start);
  }

  // z = softcap(x) / tau of a real global column held by the shard.
  float z(int64_t global_col) const {
    return canon::scored_logit(x(global_col), spec_.softcap, temperature_);
  }

  // numerics.md "Leaf partial": over the tile's real columns only, in column order.
  canon::Partial leaf(int64_t tile, bool with_entropy) const {
    const kernels::ColumnRange cols = kernels::tile_real_columns(spec_.geometry, tile);
    if (cols.begin >= cols.end) return canon::identity_partial();  // tile at or beyond T
    std::vector<float> z_tile;
    z_tile.reserve(static_cast<size_t>(cols.end - cols.begin));
    for (int64_t c = cols.begin; c < cols.end; ++c) z_tile.push_back(z(c));
    return canon::leaf_partial(z_tile.data(), static_cast<int64_t>(z_tile.size()), with_entropy);
  }

  // numerics.md "Tree over tiles": the node covering tiles [index << level, (index+1) << level).
  canon::Partial node(int level, int64_t index, bool with_entropy) const {
    if (level == 0) return leaf(index, with_entropy);
    const canon::Partial left = node(level - 1, 2 * index, with_entropy);
    const canon::Partial right = node(level - 1, 2 * index + 1, with_entropy);
    return canon::merge(left, right, with_entropy);
  }

 private:
  const LogitsView& shard_;
  const ShardSpec& spec_;
  int64_t row_offset_;
  float temperature_;  // this row's divisor
};

class ReferenceKernels final : public ShardKernels {
 public:
  std::string name() const override { return "scalar-reference"; }
  bool supports_unaligned_bounds() const override { return true; }

  void node_partials(const LogitsView& shard, const ShardSpec& spec,
                     std::span<const TreeNode> nodes, bool with_entropy, std::span<NodePartial> out,
                     const ExecOptions& /*exec*/) const override {
    kernels::validate_node_partials(shard, spec, nodes, out);
    for (int64_t r = 0; r < shard.rows; ++r) {
      const ShardRow row(shard, spec, r);
      for (size_t j = 0; j < nodes.size(); ++j) {
        out[static_cast<size_t>(r) * nodes.size() + j] =
            row.node(nodes[j].level, nodes[j].index, with_entropy);
      }
    }
  }

  void merge_roots(const TileGeometry& geometry, std::span<const TreeNode> nodes,
                   std::span<const NodePartial> partials, int64_t rows, RootsOut roots,
                   const ExecOptions& /*exec*/) const override {
    kernels::validate_merge_roots(geometry, nodes, partials, rows, roots);
    const bool with_entropy = !roots.entropy.empty();
    const numerics::RootProgram program(geometry, nodes);
    const std::span<const int32_t> ops = program.ops();
    const auto num_ops = static_cast<int64_t>(ops.size());
    for (int64_t r = 0; r < rows; ++r) {
      const NodePartial* row = partials.data() + static_cast<size_t>(r) * nodes.size();
      const canon::Partial root = with_entropy
                                      ? numerics::run_root_program<true>(ops.data(), num_ops, row)
                                      : numerics::run_root_program<false>(ops.data(), num_ops, row);
      const canon::RootValues values = canon::finish_root(root);
      roots.lse[static_cast<size_t>(r)] = values.lse;
      if (with_entropy) roots.entropy[static_cast<size_t>(r)] = values.entropy;
    }
  }

  void backward(const LogitsView& shard, const ShardSpec& spec, const BackwardInputs& in,
                const MutableLogitsView& grad, const ExecOptions& /*exec*/) const override {
    kernels::validate_backward(shard, spec, in, grad, kernels::ShardBounds::any_bounds);
    const int64_t real_end = spec.geometry.real_vocab;
    for (int64_t r = 0; r < shard.rows; ++r) {
      const auto ri = static_cast<size_t>(r);
      const canon::GradCoefficients g = kernels::grad_coefficients(in, r);
      const float lse = in.lse[ri];
      const float entropy = g.has_entropy ? in.entropy[ri] : 0.0f;
      const int64_t target = in.target_local[ri];
      const ShardRow row(shard, spec, r);
      for (int64_t c = 0; c < shard.cols; ++c) {
        const int64_t global = spec.vocab_start + c;
        float value = 0.0f;  // padding columns: exactly +0
        if (global < real_end) {
          value = canon::grad_of_logit(row.x(global), c == target, lse, entropy, g,
                                       spec.temperature_of(r), spec.softcap);
        }
        numerics::store_from_float(grad.data, grad.dtype, r * grad.row_stride + c, value);
      }
    }
  }
};

}  // namespace

void read_target_logits(const LogitsView& shard, const ShardSpec& spec,
                        std::span<const int64_t> target_local, std::span<float> out) {
  const char* kernel = "read_target_logits";
  kernels::validate_shard(shard, spec, kernel, kernels::ShardBounds::any_bounds);
  kernels::validate_targets(shard, spec, target_local, kernel);
  if (static_cast<int64_t>(out.size()) != shard.rows) {
    throw ContractError("detlogp read_target_logits: out has " + std::to_string(out.size()) +
                        " entries, expected rows = " + std::to_string(shard.rows));
  }
  for (int64_t r = 0; r < shard.rows; ++r) {
    const auto ri = static_cast<size_t>(r);
    const int64_t t = target_local[ri];
    if (t < 0) {
      out[ri] = 0.0f;
      continue;
    }
    const float x = numerics::load_as_float(shard.data, shard.dtype, r * shard.row_stride + t);
    // NaN payloads differ between devices: a NaN target logit is written as the canonical NaN.
    out[ri] = canon::canonicalize(canon::scored_logit(x, spec.softcap, spec.temperature_of(r)));
  }
}

const ShardKernels& reference_kernels() {
  static const ReferenceKernels kernels;
  return kernels;
}

}  // namespace detlogp
