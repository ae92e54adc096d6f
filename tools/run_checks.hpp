#pragma once
// The pieces `detlogp run` shares between its paths (in-process, MPI, --fused): the up-front
// checks of its options and of the memory a run will take, the vocabulary layout of a TP
// degree, and the checks of the results (padding gradient, float64 reference on sampled rows).

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "cli.hpp"
#include "detlogp/detlogp.hpp"
#include "reference.hpp"
#include "synthetic.hpp"

namespace detlogp::cli {

inline constexpr int64_t kSampleRows = 16;

// The checks of `run`'s options that need no data, the same for every path and done before
// anything is made: --tokens, --real-vocab, --tile-width (and --hidden with --fused) > 0,
// --temperature finite and > 0, --threads >= 0, --dtype, --device, --collective-timeout.
// UsageError naming the option and the value.
void check_run_options(const RunOptions& o);

// The TP degrees of --tp (default 1,2,4) on the in-process group, each within its limit;
// UsageError for --cp other than 1 (context parallelism splits processes: --comm mpi).
std::vector<int64_t> in_process_tps(const RunOptions& o);

// One kind of buffer a run allocates: `count` buffers of rows x cols elements of
// `element_size` bytes each.
struct RunBuffer {
  std::string_view name;  // e.g. "the logits and the gradient"
  std::uint64_t count = 1, rows = 0, cols = 0, element_size = 0;
};

// The bytes of `buffers`, refused before anything is allocated unless they fit in the memory
// this process may still use (io::require_memory, std::runtime_error: "<what> (<the buffers'
// names>) needs N bytes ... available (<source>); <fix>"). Every product and the sum are
// checked: an overflow is a ContractError "<what>: the size of <name> overflows 64-bit sizes
// (...)".
std::uint64_t require_run_memory(std::span<const RunBuffer> buffers, std::string_view what,
                                 std::string_view fix);

// Megatron's padded vocabulary and equal shards (megatron_bounds); when those bounds are not
// multiples of the tile width, whole tiles instead (even_tile_aligned_bounds).
VocabLayout run_layout(int64_t real_vocab, int64_t tp, int64_t tile_width);

// True when columns [real, grad.cols) of every row are exactly +0.
bool padding_is_zero(const LogitsView& grad, int64_t real);

// The float64 reference on kSampleRows rows of the whole batch: logits regenerated from
// `spec`, outputs and gradient (`grad`: [tokens, >= real], any row_stride) from the operator.
Accuracy check_sampled_rows(const SyntheticSpec& spec, const SyntheticRows& rows, float temperature,
                            std::optional<float> softcap, std::span<const float> logp,
                            std::span<const float> lse, std::span<const float> entropy,
                            const LogitsView& grad);

}  // namespace detlogp::cli
