#include "op/boundary_fragments.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "op/preflight.hpp"
#include "op/vocab_layout.hpp"

namespace detlogp::op {

int64_t fragment_width(const LogprobContract& c) {
  const TileGeometry g = tile_geometry(c);
  int64_t widest = 0;
  for (const VocabRange& b : c.sharding().vocab_shard_bounds()) {
    widest = std::max(widest, shard_tiles(b, g).head_cols(b));
  }
  return widest;
}

int64_t fragment_block_bytes(const LogprobContract& c, int64_t rows) {
  return rows * fragment_width(c) * static_cast<int64_t>(dtype_size(c.dtype()));
}

namespace {

// Copies `cols` columns of every row from `src` (row stride `src_stride` elements) to `dst`
// (row stride `dst_stride`), in elements of `elt` bytes.
void copy_columns(const std::byte* src, int64_t src_stride, std::byte* dst, int64_t dst_stride,
                  int64_t rows, int64_t cols, std::size_t elt) {
  if (cols <= 0) return;
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + static_cast<std::size_t>(r * dst_stride) * elt,
                src + static_cast<std::size_t>(r * src_stride) * elt,
                static_cast<std::size_t>(cols) * elt);
  }
}

}  // namespace

SplitTile exchange_fragments(Communicator& comm, const LogprobContract& c,
                             const LogitsView& logits) {
  const ShardingSpec& sh = c.sharding();
  const TileGeometry g = tile_geometry(c);
  const auto& bounds = sh.vocab_shard_bounds();
  const int64_t me = sh.tp_rank();
  const int64_t rows = logits.rows;
  const int64_t width = fragment_width(c);
  const std::size_t elt = dtype_size(logits.dtype);
  const auto* local = static_cast<const std::byte*>(logits.data);

  // This rank's block: its head fragment, [rows, width] (the columns past its own are zero).
  std::vector<std::byte> send(static_cast<std::size_t>(rows * width) * elt, std::byte{0});
  const ShardTiles mine = shard_tiles(bounds[me], g);
  copy_columns(local, logits.row_stride, send.data(), width, rows, mine.head_cols(bounds[me]), elt);
  std::vector<std::byte> recv(send.size() * bounds.size());
  collective_step("all-gather of the boundary fragments of split tiles",
                  [&] { comm.all_gather(send, recv); });

  SplitTile tile;
  tile.view = LogitsView{.data = nullptr, .dtype = logits.dtype, .rows = rows};
  if (mine.split_tile < 0) return tile;
  const int64_t begin = mine.split_tile * g.tile_width;
  const int64_t cols = std::min(begin + g.tile_width, g.real_vocab) - begin;
  tile.bytes.assign(static_cast<std::size_t>(rows * cols) * elt, std::byte{0});
  tile.vocab_start = begin;
  // Its own tail columns [begin, end), then each later rank's fragment of the tile, in order.
  int64_t filled = bounds[me].end - begin;
  copy_columns(local + static_cast<std::size_t>(begin - bounds[me].start) * elt, logits.row_stride,
               tile.bytes.data(), cols, rows, filled, elt);
  for (std::size_t r = static_cast<std::size_t>(me) + 1; r < bounds.size(); ++r) {
    const ShardTiles t = shard_tiles(bounds[r], g);
    if (t.head_tile != mine.split_tile) continue;
    const int64_t n = t.head_cols(bounds[r]);
    copy_columns(recv.data() + r * send.size(), width,
                 tile.bytes.data() + static_cast<std::size_t>(bounds[r].start - begin) * elt, cols,
                 rows, n, elt);
    filled += n;
  }
  if (filled != cols) {
    throw std::logic_error("boundary fragments: the split tile's columns were not all received");
  }
  tile.view.data = tile.bytes.data();
  tile.view.cols = cols;
  tile.view.row_stride = cols;
  return tile;
}

}  // namespace detlogp::op
