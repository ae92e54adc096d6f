#include "op/boundary_fragments.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "op/preflight.hpp"

namespace detlogp::op {

int64_t fragment_width(const LogprobContract& c) {
  const TileGeometry g = tile_geometry(c);
  int64_t widest = 0;
  for (const VocabRange& b : c.sharding().vocab_shard_bounds()) {
    widest = std::max(widest, shard_tiles(b, g).head_cols(b));
  }
  return widest;
}

int64_t fragment_block_bytes(const LogprobContract& c, int64_t column_bytes) {
  return fragment_width(c) * column_bytes;
}

namespace {

// A shard's vocabulary columns as bytes: column j of line l is `col_bytes` bytes at
// data + l * line_stride + j * col_stride. Logits: a line per row, a column one element.
// A weight shard: one line, a column one weight row.
struct Columns {
  const std::byte* data = nullptr;
  int64_t lines = 0;
  int64_t line_stride = 0;
  int64_t col_stride = 0;
  int64_t col_bytes = 0;
};

// Columns [first, first + n) of `src`, every line, into the packed [lines][dst_cols][col_bytes]
// buffer `dst` from its column `dst_first`.
void copy_columns(const Columns& src, int64_t first, int64_t n, std::byte* dst, int64_t dst_cols,
                  int64_t dst_first) {
  if (n <= 0) return;
  const auto cb = static_cast<std::size_t>(src.col_bytes);
  for (int64_t l = 0; l < src.lines; ++l) {
    const std::byte* s = src.data + l * src.line_stride + first * src.col_stride;
    std::byte* d = dst + static_cast<std::size_t>(l * dst_cols + dst_first) * cb;
    if (src.col_stride == src.col_bytes) {
      std::memcpy(d, s, static_cast<std::size_t>(n) * cb);
    } else {
      for (int64_t j = 0; j < n; ++j) std::memcpy(d + j * cb, s + j * src.col_stride, cb);
    }
  }
}

// The all-gather of every rank's head fragment (the first columns of `head`) and this rank's
// split tile, packed [lines][its real columns][col_bytes] (bytes empty and cols 0 when it
// completes none) from its own columns of the tile (`tail`, from the tile's first column) and
// the later ranks' fragments.
SplitTile exchange(Communicator& comm, const LogprobContract& c, const Columns& head,
                   const Columns& tail, std::string_view step) {
  const ShardingSpec& sh = c.sharding();
  const TileGeometry g = tile_geometry(c);
  const auto& bounds = sh.vocab_shard_bounds();
  const int64_t me = sh.tp_rank();
  const int64_t width = fragment_width(c);

  // This rank's block: its head fragment, [lines, width] columns (those past its own are zero).
  std::vector<std::byte> send(static_cast<std::size_t>(head.lines * width * head.col_bytes),
                              std::byte{0});
  const ShardTiles mine = shard_tiles(bounds[me], g);
  copy_columns(head, 0, mine.head_cols(bounds[me]), send.data(), width, 0);
  std::vector<std::byte> recv(send.size() * bounds.size());
  collective_step(step, [&] { comm.all_gather(send, recv); });

  SplitTile tile;
  if (mine.split_tile < 0) return tile;
  const int64_t begin = mine.split_tile * g.tile_width;
  const int64_t cols = std::min(begin + g.tile_width, g.real_vocab) - begin;
  tile.bytes.assign(static_cast<std::size_t>(head.lines * cols * head.col_bytes), std::byte{0});
  tile.vocab_start = begin;
  tile.cols = cols;
  // Its own tail columns [begin, end), then each later rank's fragment of the tile, in order.
  int64_t filled = bounds[me].end - begin;
  copy_columns(tail, 0, filled, tile.bytes.data(), cols, 0);
  for (std::size_t r = static_cast<std::size_t>(me) + 1; r < bounds.size(); ++r) {
    const ShardTiles t = shard_tiles(bounds[r], g);
    if (t.head_tile != mine.split_tile) continue;
    const int64_t n = t.head_cols(bounds[r]);
    const Columns block{.data = recv.data() + r * send.size(),
                        .lines = head.lines,
                        .line_stride = width * head.col_bytes,
                        .col_stride = head.col_bytes,
                        .col_bytes = head.col_bytes};
    copy_columns(block, 0, n, tile.bytes.data(), cols, bounds[r].start - begin);
    filled += n;
  }
  if (filled != cols) {
    throw std::logic_error("boundary fragments: the split tile's columns were not all received");
  }
  return tile;
}

// The columns of logits [rows, cols].
Columns columns_of(const LogitsView& logits) {
  const auto elt = static_cast<int64_t>(dtype_size(logits.dtype));
  return Columns{.data = static_cast<const std::byte*>(logits.data),
                 .lines = logits.rows,
                 .line_stride = logits.row_stride * elt,
                 .col_stride = elt,
                 .col_bytes = elt};
}

// `all` from this rank's first column of the split tile it completes (as is when none).
Columns tail_of(Columns all, const LogprobContract& c) {
  const ShardingSpec& sh = c.sharding();
  const VocabRange b = sh.vocab_shard_bounds()[static_cast<std::size_t>(sh.tp_rank())];
  const ShardTiles mine = shard_tiles(b, tile_geometry(c));
  if (mine.split_tile >= 0)
    all.data += (mine.split_tile * c.tile_width() - b.start) * all.col_stride;
  return all;
}

// The split tile of logits as a view [rows, its real columns].
SplitTile logits_tile(SplitTile tile, const LogitsView& like) {
  tile.view = LogitsView{.data = nullptr, .dtype = like.dtype, .rows = like.rows};
  if (tile.cols > 0) {
    tile.view.data = tile.bytes.data();
    tile.view.cols = tile.cols;
    tile.view.row_stride = tile.cols;
  }
  return tile;
}

}  // namespace

SplitTile exchange_fragments(Communicator& comm, const LogprobContract& c,
                             const LogitsView& logits) {
  const Columns all = columns_of(logits);
  return logits_tile(exchange(comm, c, all, tail_of(all, c),
                              "all-gather of the boundary fragments of split tiles"),
                     logits);
}

SplitTile exchange_fragment_logits(Communicator& comm, const LogprobContract& c,
                                   const LogitsView& head, const LogitsView& tail) {
  return logits_tile(exchange(comm, c, columns_of(head), columns_of(tail),
                              "all-gather of the logits of split tiles' boundary fragments"),
                     head);
}

SplitTile exchange_weight_fragments(Communicator& comm, const LogprobContract& c,
                                    const LogitsView& weight) {
  const auto elt = static_cast<int64_t>(dtype_size(weight.dtype));
  const Columns rows{.data = static_cast<const std::byte*>(weight.data),
                     .lines = 1,
                     .line_stride = 0,
                     .col_stride = weight.row_stride * elt,
                     .col_bytes = weight.cols * elt};
  SplitTile tile = exchange(comm, c, rows, tail_of(rows, c),
                            "all-gather of the lm_head weight rows of split tiles");
  tile.view = LogitsView{.data = nullptr,
                         .dtype = weight.dtype,
                         .rows = tile.cols,
                         .cols = weight.cols,
                         .row_stride = weight.cols};
  if (tile.cols > 0) tile.view.data = tile.bytes.data();
  return tile;
}

FullTiles full_tiles_of(const ShardTiles& tiles, const VocabRange& bounds, int64_t tile_width) {
  FullTiles f;
  f.start = tiles.full_begin * tile_width;
  f.skip = f.start - bounds.start;
  const int64_t end = tiles.split_tile >= 0 ? tiles.full_end * tile_width : bounds.end;
  f.cols = tiles.full_end > tiles.full_begin ? std::max<int64_t>(end - f.start, 0) : 0;
  return f;
}

std::vector<NodePartial> join_split_partials(std::vector<NodePartial> full, std::size_t full_nodes,
                                             std::span<const NodePartial> split, int64_t rows) {
  if (split.empty()) return full;
  const std::size_t n = full_nodes + 1;
  std::vector<NodePartial> out(static_cast<std::size_t>(rows) * n);
  for (int64_t i = 0; i < rows; ++i) {
    std::copy_n(full.begin() + i * full_nodes, full_nodes, out.begin() + i * n);
    out[i * n + full_nodes] = split[static_cast<std::size_t>(i)];
  }
  return out;
}

}  // namespace detlogp::op
