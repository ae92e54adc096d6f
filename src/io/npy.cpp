#include "io/npy.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "io/detail.hpp"
#include "io/file.hpp"
#include "memory/memory.hpp"

namespace detlogp::io {
namespace {

using detail::fail;
using detail::in_quotes;

constexpr std::array<unsigned char, 6> kMagic{0x93, 'N', 'U', 'M', 'P', 'Y'};
constexpr std::size_t kAlign = 64;
constexpr std::size_t kGrowthAxisMaxDigits = 21;  // numpy's spare room for growing shape[0]
constexpr auto kInt64Max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

std::size_t preamble_size(int major) { return major == 1 ? 10 : 12; }

bool is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

// A strict reader of the one Python literal numpy writes:
// {'descr': <str>, 'fortran_order': <bool>, 'shape': <tuple of ints>, }
class HeaderDictParser {
 public:
  HeaderDictParser(std::string_view text, std::string_view label) : text_(text), label_(label) {}

  void parse(NpyHeader& header) {
    for (char ch : text_) {
      const auto byte = static_cast<unsigned char>(ch);
      if (byte >= 0x80 || (byte < 0x20 && !is_space(ch))) {
        problem(fmt::format("header holds the byte 0x{:02x}; expected an ASCII Python dict", byte));
      }
    }
    skip_space();
    expect('{', "the header dict to start with '{'");
    bool have_descr = false, have_order = false, have_shape = false;
    while (true) {
      skip_space();
      if (eat('}')) break;
      const std::string key = string_literal("a quoted key");
      skip_space();
      expect(':', "':' after the key");
      skip_space();
      if (key == "descr") {
        if (have_descr) problem("header repeats 'descr'");
        have_descr = true;
        parse_descr(header);
      } else if (key == "fortran_order") {
        if (have_order) problem("header repeats 'fortran_order'");
        have_order = true;
        parse_fortran_order();
      } else if (key == "shape") {
        if (have_shape) problem("header repeats 'shape'");
        have_shape = true;
        parse_shape(header.shape);
      } else {
        problem(fmt::format("unexpected header key {} (expected descr, fortran_order, shape)",
                            in_quotes(key)));
      }
      skip_space();
      if (eat(',')) continue;
      if (eat('}')) break;
      problem(fmt::format("expected ',' or '}}' in the header dict at byte {}", pos_));
    }
    skip_space();
    if (pos_ != text_.size()) problem("unexpected text after the header dict");
    if (!have_descr) problem("header lacks 'descr'");
    if (!have_order) problem("header lacks 'fortran_order'");
    if (!have_shape) problem("header lacks 'shape'");
  }

 private:
  [[noreturn]] void problem(std::string_view message) const { fail(label_, message); }

  void skip_space() {
    while (pos_ < text_.size() && is_space(text_[pos_])) ++pos_;
  }
  bool eat(char ch) {
    if (pos_ < text_.size() && text_[pos_] == ch) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char ch, std::string_view what) {
    if (!eat(ch)) problem(fmt::format("malformed header: expected {} at byte {}", what, pos_));
  }
  bool at_end() const { return pos_ >= text_.size(); }

  std::string string_literal(std::string_view what) {
    if (at_end() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      problem(fmt::format("malformed header: expected {} at byte {}", what, pos_));
    }
    const char quote = text_[pos_++];
    const std::size_t start = pos_;
    while (!at_end() && text_[pos_] != quote) {
      if (text_[pos_] == '\\') problem("escape sequences in header strings are not supported");
      ++pos_;
    }
    if (at_end()) problem("malformed header: unterminated string");
    return std::string(text_.substr(start, pos_++ - start));
  }

  std::string_view identifier() {
    const std::size_t start = pos_;
    while (!at_end() && ((text_[pos_] >= 'a' && text_[pos_] <= 'z') ||
                         (text_[pos_] >= 'A' && text_[pos_] <= 'Z'))) {
      ++pos_;
    }
    return text_.substr(start, pos_ - start);
  }

  void parse_descr(NpyHeader& header) {
    if (!at_end() && (text_[pos_] == '[' || text_[pos_] == '(' || text_[pos_] == '{')) {
      problem("structured dtypes (a list descr) are not supported");
    }
    const std::string descr = string_literal("a quoted descr string");
    if (const auto dtype = dtype_from_npy_descr(descr)) {
      header.dtype = *dtype;
      return;
    }
    if (descr.size() > 1 && descr[0] == '>') {
      problem(
          fmt::format("big-endian descr {} is not supported; save a little-endian array "
                      "(arr.astype('<{}'))",
                      in_quotes(descr), detail::printable(descr.substr(1), 8)));
    }
    problem(fmt::format("unsupported descr {} (supported: <f4, <f2, <i8, <i4, |b1, |u1)",
                        in_quotes(descr)));
  }

  void parse_fortran_order() {
    const std::string_view word = identifier();
    if (word == "False") return;
    if (word == "True") {
      problem(
          "fortran_order True (column-major data) is not supported; save a C-ordered array "
          "(np.ascontiguousarray)");
    }
    problem(fmt::format("fortran_order must be False, got {}",
                        in_quotes(word.empty() ? text_.substr(pos_, 8) : word)));
  }

  void parse_shape(std::vector<std::int64_t>& shape) {
    if (!eat('('))
      problem(fmt::format("malformed header: 'shape' must be a tuple at byte {}", pos_));
    skip_space();
    if (eat(')')) return;  // () : a 0-d array
    bool trailing_comma = false;
    while (true) {
      skip_space();
      if (eat('-')) problem("shape has a negative dimension");
      if (at_end() || text_[pos_] < '0' || text_[pos_] > '9') {
        problem(fmt::format("malformed header: expected a dimension in 'shape' at byte {}", pos_));
      }
      std::uint64_t dim = 0;
      while (!at_end() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        const auto digit = static_cast<std::uint64_t>(text_[pos_++] - '0');
        if (dim > (kInt64Max - digit) / 10) problem("shape has a dimension too large for int64");
        dim = dim * 10 + digit;
      }
      if (!eat('L')) eat('l');  // Python 2 long literals, as old numpy wrote them
      if (shape.size() == kMaxRank) {
        problem(fmt::format("shape has more than {} dimensions", kMaxRank));
      }
      shape.push_back(static_cast<std::int64_t>(dim));
      skip_space();
      trailing_comma = eat(',');
      skip_space();
      if (eat(')')) break;
      if (!trailing_comma) {
        problem(fmt::format("malformed header: expected ',' or ')' in 'shape' at byte {}", pos_));
      }
    }
    if (shape.size() == 1 && !trailing_comma) {
      problem("'shape' must be a tuple: (n) is a number, write (n,)");
    }
  }

  std::string_view text_;
  std::string_view label_;
  std::size_t pos_ = 0;
};

std::string shape_tuple(std::span<const std::int64_t> shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  if (shape.size() == 1) out += ",";
  return out + ")";
}

}  // namespace

std::uint64_t parse_npy_data_offset(std::span<const std::byte> first_bytes,
                                    std::uint64_t total_size, std::string_view label) {
  if (total_size == 0) fail(label, "file is empty");
  const std::size_t have = std::min<std::size_t>(first_bytes.size(), kMagic.size());
  for (std::size_t i = 0; i < have; ++i) {
    if (static_cast<unsigned char>(first_bytes[i]) != kMagic[i]) {
      fail(label, "not an .npy file: bad magic (expected \\x93NUMPY)");
    }
  }
  if (total_size < 10 || first_bytes.size() < 10) {
    fail(label, fmt::format("file is {} bytes, too short for the npy preamble", total_size));
  }
  const int major = static_cast<int>(first_bytes[6]);
  const int minor = static_cast<int>(first_bytes[7]);
  if (minor != 0 || major < 1 || major > 3) {
    fail(label, fmt::format("unsupported npy format version {}.{} (supported: 1.0, 2.0, 3.0)",
                            major, minor));
  }
  const std::size_t preamble = preamble_size(major);
  if (total_size < preamble || first_bytes.size() < preamble) {
    fail(label,
         fmt::format("file is {} bytes, too short for the npy {}.0 preamble", total_size, major));
  }
  std::uint64_t length = 0;
  for (std::size_t i = preamble; i-- > 8;) {
    length = (length << 8) | static_cast<std::uint8_t>(first_bytes[i]);
  }
  if (length > total_size - preamble) {
    fail(label, fmt::format("header length {} exceeds the file size {}", length, total_size));
  }
  if (length > kMaxNpyHeaderBytes) {
    fail(label,
         fmt::format("header length {} exceeds the limit of {} bytes", length, kMaxNpyHeaderBytes));
  }
  return preamble + length;
}

NpyHeader parse_npy_header(std::span<const std::byte> header_bytes, std::uint64_t total_size,
                           std::string_view label) {
  const std::uint64_t data_offset = parse_npy_data_offset(header_bytes, total_size, label);
  if (header_bytes.size() < data_offset) fail(label, "header is truncated");
  NpyHeader header;
  header.major = static_cast<int>(header_bytes[6]);
  header.minor = 0;
  header.data_offset = data_offset;
  const std::size_t preamble = preamble_size(header.major);
  const std::string_view text(reinterpret_cast<const char*>(header_bytes.data()) + preamble,
                              data_offset - preamble);
  HeaderDictParser(text, label).parse(header);

  const auto nbytes = checked_nbytes(header.shape, header.dtype);
  const std::string what =
      fmt::format("shape {} of {}", shape_tuple(header.shape), *npy_descr(header.dtype));
  if (!nbytes) fail(label, what + " overflows 64-bit byte sizes");
  const std::uint64_t available = total_size - data_offset;
  if (*nbytes > available) {
    fail(label, fmt::format("data is truncated: {} needs {} bytes but the file holds {} after "
                            "the header",
                            what, *nbytes, available));
  }
  if (*nbytes < available) {
    fail(label, fmt::format("{} needs {} bytes but the file holds {} after the header ({} "
                            "trailing bytes)",
                            what, *nbytes, available, available - *nbytes));
  }
  header.data_bytes = *nbytes;
  return header;
}

Tensor parse_npy(std::span<const std::byte> bytes, std::string_view label, std::string_view name) {
  const std::uint64_t data_offset = parse_npy_data_offset(bytes, bytes.size(), label);
  NpyHeader header = parse_npy_header(bytes.first(data_offset), bytes.size(), label);
  const auto data = bytes.subspan(header.data_offset, header.data_bytes);
  return Tensor{std::string(name), header.dtype, std::move(header.shape),
                std::vector<std::byte>(data.begin(), data.end())};
}

namespace {

NpyHeader read_header(const InputFile& file) {
  std::array<std::byte, 12> first{};
  const auto first_size = static_cast<std::size_t>(std::min<std::uint64_t>(12, file.size()));
  file.read_at(0, std::span(first).first(first_size));
  const std::uint64_t data_offset = parse_npy_data_offset(
      std::span<const std::byte>(first).first(first_size), file.size(), file.label());
  std::vector<std::byte> bytes(data_offset);  // <= file size and <= 1 MiB + 12: checked above
  file.read_at(0, bytes);
  return parse_npy_header(bytes, file.size(), file.label());
}

}  // namespace

NpyHeader read_npy_header(const std::filesystem::path& path) {
  const InputFile file(path);
  return read_header(file);
}

Tensor read_npy(const std::filesystem::path& path) {
  const InputFile file(path);
  NpyHeader header = read_header(file);
  Tensor tensor{path.stem().string(), header.dtype, std::move(header.shape), {}};
  // data_bytes == file size - header (checked above), but a sparse file can claim terabytes.
  require_memory(header.data_bytes,
                 fmt::format("{}: reading its {} array of shape {}", file.label(),
                             dtype_name(tensor.dtype), format_shape(tensor.shape)),
                 "use a smaller file (fewer tokens per file)");
  tensor.data = allocate_bytes(header.data_bytes, file.label() + ": reading the array");
  file.read_at(header.data_offset, tensor.data);
  return tensor;
}

namespace {

std::vector<std::byte> npy_preamble_and_header(const TensorRef& tensor, std::string_view label) {
  check_tensor(tensor, label);
  const auto descr = npy_descr(tensor.dtype);
  if (!descr) {
    fail(label, fmt::format("tensor {} has dtype {}, which .npy cannot hold (numpy has no "
                            "bfloat16 descr); write a .safetensors file instead",
                            in_quotes(tensor.name), dtype_name(tensor.dtype)));
  }
  // As numpy.lib.format: the dict repr with sorted keys, spare room for growing shape[0], then
  // spaces and a newline so that the data starts at a multiple of 64 bytes.
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", *descr,
                                 shape_tuple(tensor.shape));
  if (!tensor.shape.empty()) {
    dict.append(kGrowthAxisMaxDigits - std::to_string(tensor.shape[0]).size(), ' ');
  }
  int major = 1;
  std::size_t hlen = dict.size() + 1;
  std::size_t pad = kAlign - (preamble_size(1) + hlen) % kAlign;
  if (hlen + pad > 0xffff) {
    major = 2;
    pad = kAlign - (preamble_size(2) + hlen) % kAlign;
  }
  const std::uint64_t length = hlen + pad;
  std::vector<std::byte> out;
  out.reserve(preamble_size(major) + length);
  for (unsigned char ch : kMagic) out.push_back(static_cast<std::byte>(ch));
  out.push_back(static_cast<std::byte>(major));
  out.push_back(std::byte{0});
  for (std::size_t i = 0; i < preamble_size(major) - 8; ++i) {
    out.push_back(static_cast<std::byte>((length >> (8 * i)) & 0xff));
  }
  for (char ch : dict) out.push_back(static_cast<std::byte>(ch));
  out.insert(out.end(), pad, static_cast<std::byte>(' '));
  out.push_back(static_cast<std::byte>('\n'));
  return out;
}

}  // namespace

std::vector<std::byte> serialize_npy(const TensorRef& tensor, std::string_view label) {
  std::vector<std::byte> out = npy_preamble_and_header(tensor, label);
  out.insert(out.end(), tensor.data.begin(), tensor.data.end());
  return out;
}

void write_npy_to(AtomicOutputFile& out, const TensorRef& tensor) {
  const std::vector<std::byte> header = npy_preamble_and_header(tensor, out.label());
  out.write(header);
  out.write(tensor.data);
}

void write_npy(const std::filesystem::path& path, const TensorRef& tensor) {
  npy_preamble_and_header(tensor, path.string());  // validates before creating anything
  AtomicOutputFile out(path);
  write_npy_to(out, tensor);
  out.commit();
}

}  // namespace detlogp::io
