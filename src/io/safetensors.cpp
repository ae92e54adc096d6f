#include "io/safetensors.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>
#include <tuple>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/detail.hpp"
#include "io/file.hpp"
#include "io/memory.hpp"

namespace detlogp::io {
namespace {

using detail::fail;
using detail::in_quotes;
using nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr int kMaxJsonDepth = 8;  // a valid header nests 3 deep
constexpr auto kInt64Max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

std::string who(std::string_view name) { return fmt::format("tensor {}", in_quotes(name)); }

// A first, validating pass over the header's JSON (SAX events, no document built): it stops at
// the first structural problem (nesting deeper than kMaxJsonDepth, a key repeated within one
// object, more than kMaxSafetensorsTensors entries) in time linear in the header's size, so the
// document parse that follows only ever sees a header that passed. (nlohmann's own parser
// callback is not used: it rescans the parent object on every closing brace, quadratic in the
// number of entries.)
class HeaderChecker final : public json::json_sax_t {
 public:
  std::string problem;  // set when a check failed or the JSON is malformed

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(json::number_integer_t) override { return value(); }
  bool number_unsigned(json::number_unsigned_t) override { return value(); }
  bool number_float(json::number_float_t, const json::string_t&) override { return value(); }
  bool string(json::string_t&) override { return value(); }
  bool binary(json::binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    if (!open()) return false;
    keys_.emplace_back();
    is_object_.push_back(true);
    return true;
  }
  bool key(json::string_t& key) override {
    if (!value()) return false;
    if (keys_.size() == 1 && key != kMetadataKey && ++tensors_ > kMaxSafetensorsTensors) {
      problem = fmt::format("header declares more than {} tensors, the limit of one file",
                            kMaxSafetensorsTensors);
      return false;
    }
    if (!keys_.back().insert(key).second) {
      problem = fmt::format("header JSON repeats the key {}", in_quotes(key));
      return false;
    }
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    is_object_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (!open()) return false;
    is_object_.push_back(false);
    return true;
  }
  bool end_array() override {
    is_object_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& error) override {
    std::string_view what = error.what();
    if (const auto close = what.find("] "); what.starts_with("[json.") && close != what.npos) {
      what.remove_prefix(close + 2);
    }
    problem = fmt::format("header is not valid JSON: {}", what);
    return false;
  }

 private:
  // A key, a scalar or a container opening inside the open containers: the depth nlohmann's
  // parser reports for it is their number.
  bool value() { return open(); }
  bool open() {
    if (is_object_.size() > static_cast<std::size_t>(kMaxJsonDepth)) {
      problem = fmt::format("header JSON nests deeper than {} levels", kMaxJsonDepth);
      return false;
    }
    return true;
  }

  std::vector<std::unordered_set<std::string>> keys_;  // keys seen, per open object
  std::vector<bool> is_object_;                        // the open containers, outermost first
  std::size_t tensors_ = 0;  // keys of the root object other than __metadata__
};

// JSON allows no raw control bytes, and nlohmann's parser would stop silently at a NUL.
void check_control_bytes(std::span<const std::byte> bytes, std::string_view label) {
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const auto byte = static_cast<unsigned char>(bytes[i]);
    if (byte < 0x20 && byte != ' ' && byte != '\t' && byte != '\n' && byte != '\r') {
      fail(label, fmt::format("header is not valid JSON: control byte 0x{:02x} at header byte {}",
                              byte, i));
    }
  }
}

// The document of a header that passed the checks (the slow path, for its error messages).
json parse_checked_json(std::span<const std::byte> bytes, std::string_view label) {
  const auto* begin = reinterpret_cast<const char*>(bytes.data());
  try {
    return json::parse(begin, begin + bytes.size());
  } catch (const json::exception& error) {  // not expected: the first pass accepted it
    fail(label, fmt::format("header is not valid JSON: {}", error.what()));
  }
}

std::uint64_t offset_value(const json& value, std::string_view name, std::string_view label) {
  if (!value.is_number_unsigned()) {
    const bool negative = value.is_number_integer();
    fail(label, fmt::format("{}: data_offsets must be non-negative integers, got {}", who(name),
                            negative ? value.dump() : std::string(value.type_name())));
  }
  const auto offset = value.get<std::uint64_t>();
  if (offset > kInt64Max) {
    fail(label, fmt::format("{}: data offset {} is out of range", who(name), offset));
  }
  return offset;
}

SafetensorsEntry parse_entry(const std::string& name, const json& value,
                             std::uint64_t data_buffer_size, std::string_view label) {
  if (!value.is_object()) {
    fail(label,
         fmt::format("{}: entry must be a JSON object, got {}", who(name), value.type_name()));
  }
  for (const auto& [key, unused] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      fail(label, fmt::format("{}: unexpected key {} (expected dtype, shape, data_offsets)",
                              who(name), in_quotes(key)));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) fail(label, fmt::format("{}: missing '{}'", who(name), key));
  }
  SafetensorsEntry entry;
  entry.name = name;

  const json& dtype = value.at("dtype");
  if (!dtype.is_string()) {
    fail(label, fmt::format("{}: 'dtype' must be a string, got {}", who(name), dtype.type_name()));
  }
  const auto parsed_dtype = dtype_from_safetensors_name(dtype.get_ref<const std::string&>());
  if (!parsed_dtype) {
    fail(label,
         fmt::format("{}: unsupported dtype {} (supported: F32, F16, BF16, I64, I32, BOOL, U8)",
                     who(name), in_quotes(dtype.get_ref<const std::string&>())));
  }
  entry.dtype = *parsed_dtype;

  const json& shape = value.at("shape");
  if (!shape.is_array()) {
    fail(label, fmt::format("{}: 'shape' must be an array, got {}", who(name), shape.type_name()));
  }
  if (shape.size() > kMaxRank) {
    fail(label, fmt::format("{}: rank {} exceeds the limit of {} dimensions", who(name),
                            shape.size(), kMaxRank));
  }
  for (const json& dim : shape) {
    if (dim.is_number_unsigned()) {
      const auto value_u = dim.get<std::uint64_t>();
      if (value_u > kInt64Max) {
        fail(label, fmt::format("{}: dimension {} is too large", who(name), value_u));
      }
      entry.shape.push_back(static_cast<std::int64_t>(value_u));
    } else if (dim.is_number_integer()) {
      fail(label, fmt::format("{}: shape has a negative dimension {}", who(name), dim.dump()));
    } else {
      fail(label, fmt::format("{}: shape entries must be integers, got {}", who(name),
                              dim.is_number() ? dim.dump() : std::string(dim.type_name())));
    }
  }

  const json& offsets = value.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) {
    fail(label, fmt::format("{}: 'data_offsets' must be an array [begin, end], got {}", who(name),
                            offsets.is_array() ? fmt::format("{} elements", offsets.size())
                                               : std::string(offsets.type_name())));
  }
  entry.begin = offset_value(offsets[0], name, label);
  entry.end = offset_value(offsets[1], name, label);
  if (entry.end < entry.begin) {
    fail(label, fmt::format("{}: data_offsets [{}, {}] end before they begin", who(name),
                            entry.begin, entry.end));
  }
  if (entry.end > data_buffer_size) {
    fail(label, fmt::format("{}: data_offsets [{}, {}] exceed the data buffer of {} bytes",
                            who(name), entry.begin, entry.end, data_buffer_size));
  }
  const auto nbytes = checked_nbytes(entry.shape, entry.dtype);
  if (!nbytes) {
    fail(label, fmt::format("{}: shape {} of {} overflows 64-bit byte sizes", who(name),
                            format_shape(entry.shape), dtype_name(entry.dtype)));
  }
  if (*nbytes != entry.end - entry.begin) {
    fail(label, fmt::format("{}: data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}",
                            who(name), entry.begin, entry.end, entry.end - entry.begin,
                            format_shape(entry.shape), dtype_name(entry.dtype), *nbytes));
  }
  return entry;
}

// The fast path for a well-formed header: entries and metadata straight from SAX events, with
// no document built (building and freeing one costs more than the parse itself for headers of
// many tensors). It accepts only headers that parse_entry would accept; at anything else it
// gives up, and the document path below produces the exact error message.
class FastHeaderBuilder final : public json::json_sax_t {
 public:
  FastHeaderBuilder(std::uint64_t data_buffer_size, SafetensorsHeader& out)
      : data_buffer_size_(data_buffer_size), out_(out) {}

  bool null() override { return false; }
  bool boolean(bool) override { return false; }
  bool number_integer(json::number_integer_t) override { return false; }
  bool number_float(json::number_float_t, const json::string_t&) override { return false; }
  bool binary(json::binary_t&) override { return false; }
  bool number_unsigned(json::number_unsigned_t value) override {
    if (value > kInt64Max) return false;
    if (state_ == State::shape) {
      if (entry_.shape.size() >= kMaxRank) return false;
      entry_.shape.push_back(static_cast<std::int64_t>(value));
      return true;
    }
    if (state_ == State::offsets) {
      if (offsets_ >= 2) return false;
      (offsets_++ == 0 ? entry_.begin : entry_.end) = value;
      return true;
    }
    return false;
  }
  bool string(json::string_t& value) override {
    if (state_ == State::metadata) {
      out_.metadata.emplace(std::move(key_), std::move(value));
      return true;
    }
    if (state_ != State::entry || key_ != "dtype" || has_dtype_) return false;
    const auto dtype = dtype_from_safetensors_name(value);
    if (!dtype) return false;
    entry_.dtype = *dtype;
    has_dtype_ = true;
    return true;
  }
  bool start_object(std::size_t) override {
    if (state_ == State::start) {
      state_ = State::root;
      return true;
    }
    if (state_ != State::root) return false;
    if (key_ == kMetadataKey) {
      state_ = State::metadata;
      return true;
    }
    state_ = State::entry;
    entry_ = SafetensorsEntry{};
    entry_.name = std::move(key_);
    has_dtype_ = has_shape_ = false;
    offsets_ = -1;
    return true;
  }
  bool key(json::string_t& key) override {
    key_ = std::move(key);
    return state_ != State::entry || key_ == "dtype" || key_ == "shape" || key_ == "data_offsets";
  }
  bool end_object() override {
    if (state_ == State::metadata) {
      state_ = State::root;
      return true;
    }
    if (state_ == State::root) {
      state_ = State::done;
      return true;
    }
    if (state_ != State::entry || !has_dtype_ || !has_shape_ || offsets_ != 2) return false;
    if (entry_.end < entry_.begin || entry_.end > data_buffer_size_) return false;
    const auto nbytes = checked_nbytes(entry_.shape, entry_.dtype);
    if (!nbytes || *nbytes != entry_.end - entry_.begin) return false;
    out_.entries.push_back(std::move(entry_));
    state_ = State::root;
    return true;
  }
  bool start_array(std::size_t) override {
    if (state_ != State::entry) return false;
    if (key_ == "shape" && !has_shape_) {
      state_ = State::shape;
      has_shape_ = true;
      return true;
    }
    if (key_ == "data_offsets" && offsets_ < 0) {
      state_ = State::offsets;
      offsets_ = 0;
      return true;
    }
    return false;
  }
  bool end_array() override {
    if (state_ != State::shape && state_ != State::offsets) return false;
    state_ = State::entry;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  enum class State { start, root, metadata, entry, shape, offsets, done };
  std::uint64_t data_buffer_size_;
  SafetensorsHeader& out_;
  State state_ = State::start;
  std::string key_;
  SafetensorsEntry entry_;
  bool has_dtype_ = false;
  bool has_shape_ = false;
  int offsets_ = -1;  // -1: no data_offsets yet; else how many were read
};

// One pass of both: the checks (whose failure is the error) and, while it keeps accepting, the
// fast builder.
class CheckAndBuild final : public json::json_sax_t {
 public:
  CheckAndBuild(HeaderChecker& checker, FastHeaderBuilder& builder)
      : checker_(checker), builder_(builder) {}
  bool built() const { return building_; }

  bool null() override {
    return both([](json::json_sax_t& h) { return h.null(); });
  }
  bool boolean(bool v) override {
    return both([&](json::json_sax_t& h) { return h.boolean(v); });
  }
  bool number_integer(json::number_integer_t v) override {
    return both([&](json::json_sax_t& h) { return h.number_integer(v); });
  }
  bool number_unsigned(json::number_unsigned_t v) override {
    return both([&](json::json_sax_t& h) { return h.number_unsigned(v); });
  }
  bool number_float(json::number_float_t v, const json::string_t& text) override {
    return both([&](json::json_sax_t& h) { return h.number_float(v, text); });
  }
  bool string(json::string_t& v) override {
    // The builder may move from v: the checker sees it first.
    return both([&](json::json_sax_t& h) { return h.string(v); });
  }
  bool binary(json::binary_t& v) override {
    return both([&](json::json_sax_t& h) { return h.binary(v); });
  }
  bool start_object(std::size_t n) override {
    return both([&](json::json_sax_t& h) { return h.start_object(n); });
  }
  bool key(json::string_t& k) override {
    return both([&](json::json_sax_t& h) { return h.key(k); });
  }
  bool end_object() override {
    return both([](json::json_sax_t& h) { return h.end_object(); });
  }
  bool start_array(std::size_t n) override {
    return both([&](json::json_sax_t& h) { return h.start_array(n); });
  }
  bool end_array() override {
    return both([](json::json_sax_t& h) { return h.end_array(); });
  }
  bool parse_error(std::size_t position, const std::string& token,
                   const nlohmann::detail::exception& error) override {
    building_ = false;
    return checker_.parse_error(position, token, error);
  }

 private:
  template <class F>
  bool both(F event) {
    if (!event(checker_)) return false;
    if (building_ && !event(builder_)) building_ = false;
    return true;
  }

  HeaderChecker& checker_;
  FastHeaderBuilder& builder_;
  bool building_ = true;
};

// The tensors must tile the data buffer: sorted by offset, each begins where the previous ended,
// and the last ends at the buffer's end (as the reference implementation requires).
void check_coverage(const std::vector<SafetensorsEntry>& entries, std::uint64_t data_buffer_size,
                    std::string_view label) {
  std::vector<const SafetensorsEntry*> by_offset;
  by_offset.reserve(entries.size());
  for (const auto& entry : entries) by_offset.push_back(&entry);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  std::uint64_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const auto* entry : by_offset) {
    if (entry->begin < covered) {
      fail(label, fmt::format("{}: data_offsets [{}, {}] overlap {} [{}, {}]", who(entry->name),
                              entry->begin, entry->end, who(previous->name), previous->begin,
                              previous->end));
    }
    if (entry->begin > covered) {
      fail(label, fmt::format("bytes [{}, {}) of the data buffer belong to no tensor", covered,
                              entry->begin));
    }
    covered = entry->end;
    previous = entry;
  }
  if (covered != data_buffer_size) {
    fail(label, fmt::format("the data buffer holds {} bytes but the tensors cover only {}",
                            data_buffer_size, covered));
  }
}

std::uint64_t load_le64(std::span<const std::byte> bytes) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<std::uint8_t>(bytes[i]);
  return value;
}

struct WritePlan {
  std::vector<std::byte> header;   // length prefix + padded JSON
  std::vector<std::size_t> order;  // tensor indices in data-buffer order
  std::uint64_t data_bytes = 0;
};

WritePlan plan_write(std::span<const TensorRef> tensors, const Metadata& metadata,
                     std::string_view label) {
  std::set<std::string_view> names;
  for (const auto& tensor : tensors) {
    check_tensor(tensor, label);
    if (tensor.name == kMetadataKey) {
      fail(label, "a tensor cannot be named '__metadata__' (reserved for the metadata)");
    }
    if (!names.insert(tensor.name).second) {
      fail(label, fmt::format("two tensors are named {}", in_quotes(tensor.name)));
    }
  }
  WritePlan plan;
  plan.order.resize(tensors.size());
  std::iota(plan.order.begin(), plan.order.end(), std::size_t{0});
  std::sort(plan.order.begin(), plan.order.end(), [&](std::size_t a, std::size_t b) {
    const auto size_a = itemsize(tensors[a].dtype);
    const auto size_b = itemsize(tensors[b].dtype);
    if (size_a != size_b) return size_a > size_b;
    return tensors[a].name < tensors[b].name;
  });
  json header = json::object();
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;
  for (std::size_t index : plan.order) {
    const auto& tensor = tensors[index];
    const std::uint64_t begin = plan.data_bytes;
    plan.data_bytes += tensor.data.size();
    header[std::string(tensor.name)] = {
        {"dtype", std::string(dtype_name(tensor.dtype))},
        {"shape", std::vector<std::int64_t>(tensor.shape.begin(), tensor.shape.end())},
        {"data_offsets", {begin, plan.data_bytes}}};
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception&) {
    fail(label, "tensor names and metadata must be valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  plan.header.resize(8 + text.size());
  std::uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) {
    plan.header[i] = static_cast<std::byte>(length & 0xff);
    length >>= 8;
  }
  std::memcpy(plan.header.data() + 8, text.data(), text.size());
  return plan;
}

}  // namespace

const SafetensorsEntry* SafetensorsHeader::find(std::string_view name) const {
  for (const auto& entry : entries) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

std::vector<std::string> SafetensorsHeader::names() const {
  std::vector<std::string> out;
  out.reserve(entries.size());
  for (const auto& entry : entries) out.push_back(entry.name);
  return out;
}

const SafetensorsEntry& SafetensorsHeader::select(std::string_view name,
                                                  std::string_view label) const {
  if (!name.empty()) {
    if (const auto* entry = find(name)) return *entry;
  }
  if (entries.size() == 1) return entries.front();
  if (entries.empty()) fail(label, "the file holds no tensors");
  if (!name.empty()) {
    fail(label, fmt::format("no tensor named {}; the file holds {} tensors: {}", in_quotes(name),
                            entries.size(), detail::in_quotes_list(names())));
  }
  fail(label, fmt::format("the file holds {} tensors ({}); say which one to read", entries.size(),
                          detail::in_quotes_list(names())));
}

const Tensor* SafetensorsContents::find(std::string_view name) const {
  for (const auto& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

std::uint64_t parse_safetensors_header_length(std::span<const std::byte> first_bytes,
                                              std::uint64_t total_size, std::string_view label) {
  if (total_size == 0) fail(label, "file is empty");
  if (total_size < 8 || first_bytes.size() < 8) {
    fail(label, fmt::format("file is {} bytes, too short for the 8-byte safetensors header length",
                            total_size));
  }
  const std::uint64_t length = load_le64(first_bytes);
  if (length > total_size - 8) {
    fail(label, fmt::format("header length {} exceeds the file size {}", length, total_size));
  }
  if (length > kMaxSafetensorsHeaderBytes) {
    fail(label, fmt::format("header length {} exceeds the limit of {} bytes", length,
                            kMaxSafetensorsHeaderBytes));
  }
  if (length < 2) fail(label, fmt::format("header length {} is too small for JSON", length));
  return length;
}

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> json_bytes,
                                           std::uint64_t data_buffer_size, std::string_view label) {
  check_control_bytes(json_bytes, label);
  {
    SafetensorsHeader header;
    HeaderChecker checker;
    FastHeaderBuilder builder(data_buffer_size, header);
    CheckAndBuild pass(checker, builder);
    const auto* begin = reinterpret_cast<const char*>(json_bytes.data());
    if (!json::sax_parse(begin, begin + json_bytes.size(), &pass)) {
      fail(label,
           checker.problem.empty() ? std::string("header is not valid JSON") : checker.problem);
    }
    if (pass.built()) {
      // Sorted by name, as the document path's std::map orders them (names are unique).
      std::sort(header.entries.begin(), header.entries.end(),
                [](const auto& a, const auto& b) { return a.name < b.name; });
      check_coverage(header.entries, data_buffer_size, label);
      return header;
    }
  }
  const json root = parse_checked_json(json_bytes, label);
  if (!root.is_object()) {
    fail(label, fmt::format("header must be a JSON object, got {}", root.type_name()));
  }
  SafetensorsHeader header;
  header.entries.reserve(root.size());
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) {
        fail(label, fmt::format("__metadata__ must be an object, got {}", value.type_name()));
      }
      for (const auto& [meta_key, meta_value] : value.items()) {
        if (!meta_value.is_string()) {
          fail(label, fmt::format("__metadata__ value for {} must be a string, got {}",
                                  in_quotes(meta_key), meta_value.type_name()));
        }
        header.metadata.emplace(meta_key, meta_value.get<std::string>());
      }
      continue;
    }
    header.entries.push_back(parse_entry(key, value, data_buffer_size, label));
  }
  // items() of a nlohmann::json object iterate in key order, so entries are sorted by name.
  check_coverage(header.entries, data_buffer_size, label);
  return header;
}

SafetensorsContents parse_safetensors(std::span<const std::byte> bytes, std::string_view label) {
  const std::uint64_t length = parse_safetensors_header_length(bytes, bytes.size(), label);
  const std::uint64_t data_start = 8 + length;
  SafetensorsHeader header =
      parse_safetensors_header(bytes.subspan(8, length), bytes.size() - data_start, label);
  SafetensorsContents contents;
  contents.metadata = std::move(header.metadata);
  contents.tensors.reserve(header.entries.size());
  for (auto& entry : header.entries) {
    const auto data = bytes.subspan(data_start + entry.begin, entry.end - entry.begin);
    contents.tensors.push_back(Tensor{std::move(entry.name), entry.dtype, std::move(entry.shape),
                                      std::vector<std::byte>(data.begin(), data.end())});
  }
  return contents;
}

namespace {

SafetensorsHeader read_header(const InputFile& file) {
  std::array<std::byte, 8> first{};
  const std::size_t first_size = static_cast<std::size_t>(std::min<std::uint64_t>(8, file.size()));
  file.read_at(0, std::span(first).first(first_size));
  const std::uint64_t length = parse_safetensors_header_length(
      std::span<const std::byte>(first).first(first_size), file.size(), file.label());
  std::vector<std::byte> text(length);  // length <= file size and <= 100 MB: checked above
  file.read_at(8, text);
  SafetensorsHeader header = parse_safetensors_header(text, file.size() - 8 - length, file.label());
  header.data_start = 8 + length;
  return header;
}

Tensor read_entry(const InputFile& file, const SafetensorsHeader& header,
                  const SafetensorsEntry& entry) {
  Tensor tensor{entry.name, entry.dtype, entry.shape, {}};
  // Within the file (checked by the header parser), but a sparse file can claim terabytes.
  const std::uint64_t bytes = entry.end - entry.begin;
  require_memory(bytes,
                 fmt::format("{}: reading {} of shape {} ({})", file.label(), who(entry.name),
                             format_shape(entry.shape), dtype_name(entry.dtype)),
                 "use a smaller file (fewer tokens per file)");
  tensor.data = allocate_bytes(bytes, fmt::format("{}: reading {}", file.label(), who(entry.name)));
  file.read_at(header.data_start + entry.begin, tensor.data);
  return tensor;
}

}  // namespace

SafetensorsHeader read_safetensors_header(const std::filesystem::path& path) {
  const InputFile file(path);
  return read_header(file);
}

SafetensorsContents read_safetensors(const std::filesystem::path& path) {
  const InputFile file(path);
  SafetensorsHeader header = read_header(file);
  SafetensorsContents contents;
  for (const auto& entry : header.entries)
    contents.tensors.push_back(read_entry(file, header, entry));
  contents.metadata = std::move(header.metadata);
  return contents;
}

Tensor read_safetensors_tensor(const std::filesystem::path& path, std::string_view name) {
  const InputFile file(path);
  const SafetensorsHeader header = read_header(file);
  return read_entry(file, header, header.select(name, file.label()));
}

std::vector<std::byte> serialize_safetensors(std::span<const TensorRef> tensors,
                                             const Metadata& metadata, std::string_view label) {
  const WritePlan plan = plan_write(tensors, metadata, label);
  std::vector<std::byte> out;
  out.reserve(plan.header.size() + plan.data_bytes);
  out.insert(out.end(), plan.header.begin(), plan.header.end());
  for (std::size_t index : plan.order) {
    out.insert(out.end(), tensors[index].data.begin(), tensors[index].data.end());
  }
  return out;
}

void write_safetensors_to(AtomicOutputFile& out, std::span<const TensorRef> tensors,
                          const Metadata& metadata) {
  const WritePlan plan = plan_write(tensors, metadata, out.label());
  out.write(plan.header);
  for (std::size_t index : plan.order) out.write(tensors[index].data);
}

void write_safetensors(const std::filesystem::path& path, std::span<const TensorRef> tensors,
                       const Metadata& metadata) {
  plan_write(tensors, metadata, path.string());  // validates before creating anything
  AtomicOutputFile out(path);
  write_safetensors_to(out, tensors, metadata);
  out.commit();
}

void write_safetensors(const std::filesystem::path& path, std::span<const Tensor> tensors,
                       const Metadata& metadata) {
  std::vector<TensorRef> refs;
  refs.reserve(tensors.size());
  for (const auto& tensor : tensors) refs.push_back(tensor.ref());
  write_safetensors(path, refs, metadata);
}

}  // namespace detlogp::io
