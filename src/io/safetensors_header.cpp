// The .safetensors header parser: the 8-byte length, then the JSON header in one SAX pass
// (no document built: building and freeing one costs more than the parse itself for headers of
// many tensors). Every rule lives here once:
//   - structure, checked as the events arrive, stopping at the first problem in time linear in
//     the header's size: valid JSON without control bytes, nesting at most kMaxJsonDepth,
//     no key repeated within an object, at most kMaxSafetensorsTensors entries;
//   - the header's content, judged per root key once its value is complete (entry_problem and
//     the __metadata__ rules); of several problems the one of the first key in name order is
//     reported, and within an entry the first rule in a fixed order, so the message does not
//     depend on the order of the JSON text;
//   - the offsets tiling the data buffer (check_coverage).

#include <algorithm>
#include <limits>
#include <optional>
#include <tuple>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/detail.hpp"
#include "io/safetensors.hpp"

namespace detlogp::io {
namespace {

using detail::fail;
using detail::in_quotes;
using detail::tensor_named;
using nlohmann::json;

constexpr int kMaxJsonDepth = 8;  // a valid header nests 3 deep
constexpr auto kInt64Max = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

// One JSON value as the rules see it: its kind and, for a number or a string, its value
// (a container is known by its kind alone).
struct JsonValue {
  enum class Kind : std::uint8_t {  // (type_name follows this order)
    null,
    boolean,
    unsigned_int,
    signed_int,
    real,
    string,
    array,
    object
  };
  JsonValue() = default;
  explicit JsonValue(Kind k) : kind(k) {}

  Kind kind = Kind::null;
  std::uint64_t u = 0;
  std::int64_t i = 0;
  double f = 0;
  std::string text;

  bool is_number() const {
    return kind == Kind::unsigned_int || kind == Kind::signed_int || kind == Kind::real;
  }
  // The JSON type's name (nlohmann's: null, boolean, number, string, array, object).
  const char* type_name() const {
    constexpr const char* kNames[] = {"null",   "boolean", "number", "number",
                                      "number", "string",  "array",  "object"};
    return kNames[static_cast<std::size_t>(kind)];
  }
  // A number as JSON writes it.
  std::string dump() const {
    return kind == Kind::unsigned_int ? json(u).dump()
           : kind == Kind::signed_int ? json(i).dump()
                                      : json(f).dump();
  }
};
using Kind = JsonValue::Kind;

// What one root entry holds, gathered as its events arrive.
struct EntryFacts {
  SafetensorsEntry entry;                     // name, dtype, the valid leading dimensions
  std::optional<std::string> unexpected_key;  // the first in name order
  bool has_dtype = false, has_shape = false, has_offsets = false;
  JsonValue dtype;
  Kind shape_kind = Kind::null;
  std::size_t rank = 0;              // elements of the shape array
  std::optional<JsonValue> bad_dim;  // the first that is not a dimension
  Kind offsets_kind = Kind::null;
  std::size_t offsets_count = 0;  // elements of the data_offsets array
  JsonValue offsets[2];
};

std::optional<std::string> offset_problem(const JsonValue& v, std::string_view name) {
  if (v.kind != Kind::unsigned_int) {
    return fmt::format("{}: data_offsets must be non-negative integers, got {}", tensor_named(name),
                       v.kind == Kind::signed_int ? v.dump() : std::string(v.type_name()));
  }
  if (v.u > kInt64Max)
    return fmt::format("{}: data offset {} is out of range", tensor_named(name), v.u);
  return std::nullopt;
}

// The rules of one entry, in their fixed order; the problem, or nothing (then `facts.entry`
// is complete).
std::optional<std::string> entry_problem(EntryFacts& facts, std::uint64_t data_buffer_size) {
  SafetensorsEntry& e = facts.entry;
  const std::string_view name = e.name;
  if (facts.unexpected_key) {
    return fmt::format("{}: unexpected key {} (expected dtype, shape, data_offsets)",
                       tensor_named(name), in_quotes(*facts.unexpected_key));
  }
  const std::pair<bool, const char*> present[] = {
      {facts.has_dtype, "dtype"}, {facts.has_shape, "shape"}, {facts.has_offsets, "data_offsets"}};
  for (const auto& [has, key] : present) {
    if (!has) return fmt::format("{}: missing '{}'", tensor_named(name), key);
  }
  if (facts.dtype.kind != Kind::string) {
    return fmt::format("{}: 'dtype' must be a string, got {}", tensor_named(name),
                       facts.dtype.type_name());
  }
  const auto dtype = dtype_from_safetensors_name(facts.dtype.text);
  if (!dtype) {
    return fmt::format("{}: unsupported dtype {} (supported: F32, F16, BF16, I64, I32, BOOL, U8)",
                       tensor_named(name), in_quotes(facts.dtype.text));
  }
  e.dtype = *dtype;
  if (facts.shape_kind != Kind::array) {
    return fmt::format("{}: 'shape' must be an array, got {}", tensor_named(name),
                       JsonValue(facts.shape_kind).type_name());
  }
  if (facts.rank > kMaxRank) {
    return fmt::format("{}: rank {} exceeds the limit of {} dimensions", tensor_named(name),
                       facts.rank, kMaxRank);
  }
  if (const auto& dim = facts.bad_dim) {
    if (dim->kind == Kind::unsigned_int) {
      return fmt::format("{}: dimension {} is too large", tensor_named(name), dim->u);
    }
    if (dim->kind == Kind::signed_int) {
      return fmt::format("{}: shape has a negative dimension {}", tensor_named(name), dim->dump());
    }
    return fmt::format("{}: shape entries must be integers, got {}", tensor_named(name),
                       dim->is_number() ? dim->dump() : std::string(dim->type_name()));
  }
  if (facts.offsets_kind != Kind::array || facts.offsets_count != 2) {
    return fmt::format(
        "{}: 'data_offsets' must be an array [begin, end], got {}", tensor_named(name),
        facts.offsets_kind == Kind::array ? fmt::format("{} elements", facts.offsets_count)
                                          : std::string(JsonValue(facts.offsets_kind).type_name()));
  }
  for (const JsonValue& offset : facts.offsets) {
    if (auto problem = offset_problem(offset, name)) return problem;
  }
  e.begin = facts.offsets[0].u;
  e.end = facts.offsets[1].u;
  if (e.end < e.begin) {
    return fmt::format("{}: data_offsets [{}, {}] end before they begin", tensor_named(name),
                       e.begin, e.end);
  }
  if (e.end > data_buffer_size) {
    return fmt::format("{}: data_offsets [{}, {}] exceed the data buffer of {} bytes",
                       tensor_named(name), e.begin, e.end, data_buffer_size);
  }
  const auto nbytes = checked_nbytes(e.shape, e.dtype);
  if (!nbytes) {
    return fmt::format("{}: shape {} of {} overflows 64-bit byte sizes", tensor_named(name),
                       format_shape(e.shape), dtype_name(e.dtype));
  }
  if (*nbytes != e.end - e.begin) {
    return fmt::format("{}: data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}",
                       tensor_named(name), e.begin, e.end, e.end - e.begin, format_shape(e.shape),
                       dtype_name(e.dtype), *nbytes);
  }
  return std::nullopt;
}

// The one pass over the header's JSON (SAX events). nlohmann's own parser callback is not
// used: it rescans the parent object on every closing brace, quadratic in the number of
// entries.
class HeaderParser final : public json::json_sax_t {
 public:
  HeaderParser(std::uint64_t data_buffer_size, SafetensorsHeader& out)
      : data_buffer_size_(data_buffer_size), out_(out) {}

  std::string structure_problem;  // set when the pass stopped (the JSON or its structure)

  // After a complete pass: the problem of the header's content, if any.
  std::optional<std::string> content_problem() const {
    if (root_kind_ != Kind::object) {
      return fmt::format("header must be a JSON object, got {}", JsonValue(root_kind_).type_name());
    }
    if (first_problem_) return std::get<2>(*first_problem_);
    return std::nullopt;
  }

  bool null() override { return scalar(JsonValue(Kind::null)); }
  bool boolean(bool) override { return scalar(JsonValue(Kind::boolean)); }
  bool number_integer(json::number_integer_t v) override {
    JsonValue value(Kind::signed_int);
    value.i = v;
    return scalar(std::move(value));
  }
  bool number_unsigned(json::number_unsigned_t v) override {
    JsonValue value(Kind::unsigned_int);
    value.u = v;
    return scalar(std::move(value));
  }
  bool number_float(json::number_float_t v, const json::string_t&) override {
    JsonValue value(Kind::real);
    value.f = v;
    return scalar(std::move(value));
  }
  bool string(json::string_t& v) override {
    JsonValue value(Kind::string);
    value.text = std::move(v);
    return scalar(std::move(value));
  }
  bool binary(json::binary_t&) override { return stop("header is not valid JSON"); }
  bool start_object(std::size_t) override { return open(Kind::object); }
  bool start_array(std::size_t) override { return open(Kind::array); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  bool key(json::string_t& key) override {
    if (!depth_ok()) return false;
    if (open_objects_ == 1 && key != kSafetensorsMetadataKey &&
        ++tensors_ > kMaxSafetensorsTensors) {
      return stop(fmt::format("header declares more than {} tensors, the limit of one file",
                              kMaxSafetensorsTensors));
    }
    Frame& top = frames_.back();
    if (!top.keys.insert(key).second) {
      return stop(fmt::format("header JSON repeats the key {}", in_quotes(key)));
    }
    if (top.role == Role::entry && key != "dtype" && key != "shape" && key != "data_offsets" &&
        (!facts_.unexpected_key || key < *facts_.unexpected_key)) {
      facts_.unexpected_key = key;
    }
    key_ = std::move(key);
    return true;
  }

  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& error) override {
    std::string_view what = error.what();
    if (const auto close = what.find("] "); what.starts_with("[json.") && close != what.npos) {
      what.remove_prefix(close + 2);
    }
    return stop(fmt::format("header is not valid JSON: {}", what));
  }

 private:
  // What an open container is to the header.
  enum class Role : std::uint8_t { root, entry, metadata, shape, offsets, ignored };
  struct Frame {
    Role role;
    bool is_object;
    std::unordered_set<std::string> keys;  // keys seen (objects only)
  };

  bool stop(std::string problem) {
    structure_problem = std::move(problem);
    return false;
  }
  // A key, a scalar or a container opening inside the open containers: its depth is their
  // number.
  bool depth_ok() {
    if (frames_.size() > static_cast<std::size_t>(kMaxJsonDepth)) {
      return stop(fmt::format("header JSON nests deeper than {} levels", kMaxJsonDepth));
    }
    return true;
  }
  bool scalar(JsonValue v) {
    if (!depth_ok()) return false;
    take(std::move(v));
    return true;
  }
  bool open(Kind kind) {
    if (!depth_ok()) return false;
    const Role role = take(JsonValue(kind));
    frames_.push_back({role, kind == Kind::object, {}});
    if (kind == Kind::object) ++open_objects_;
    return true;
  }
  bool close() {
    if (frames_.back().role == Role::entry) {
      if (auto problem = entry_problem(facts_, data_buffer_size_)) {
        note(facts_.entry.name, {}, std::move(*problem));
      } else {
        out_.entries.push_back(std::move(facts_.entry));
      }
    }
    if (frames_.back().is_object) --open_objects_;
    frames_.pop_back();
    return true;
  }

  // A problem of root key `key` (and of `sub_key` within it): the first in name order wins.
  void note(const std::string& key, const std::string& sub_key, std::string message) {
    if (!first_problem_ || std::tie(key, sub_key) < std::tie(std::get<0>(*first_problem_),
                                                             std::get<1>(*first_problem_))) {
      first_problem_.emplace(key, sub_key, std::move(message));
    }
  }

  // The value that starts now (a scalar, or a container opening) under key_ of the innermost
  // open container: what it is to the header. Returns the role of its container.
  Role take(JsonValue v) {
    if (frames_.empty()) {
      root_kind_ = v.kind;
      return v.kind == Kind::object ? Role::root : Role::ignored;
    }
    switch (frames_.back().role) {
      case Role::root:
        if (key_ == kSafetensorsMetadataKey) {
          if (v.kind == Kind::object) return Role::metadata;
          note(key_, {}, fmt::format("__metadata__ must be an object, got {}", v.type_name()));
          return Role::ignored;
        }
        if (v.kind != Kind::object) {
          note(key_, {},
               fmt::format("{}: entry must be a JSON object, got {}", tensor_named(key_),
                           v.type_name()));
          return Role::ignored;
        }
        facts_ = EntryFacts{};
        facts_.entry.name = key_;
        return Role::entry;
      case Role::entry:
        if (key_ == "dtype") {
          facts_.has_dtype = true;
          facts_.dtype = std::move(v);
        } else if (key_ == "shape") {
          facts_.has_shape = true;
          facts_.shape_kind = v.kind;
          if (v.kind == Kind::array) return Role::shape;
        } else if (key_ == "data_offsets") {
          facts_.has_offsets = true;
          facts_.offsets_kind = v.kind;
          if (v.kind == Kind::array) return Role::offsets;
        }
        return Role::ignored;
      case Role::metadata:
        if (v.kind == Kind::string) {
          out_.metadata.emplace(key_, std::move(v.text));
        } else {
          note(std::string(kSafetensorsMetadataKey), key_,
               fmt::format("__metadata__ value for {} must be a string, got {}", in_quotes(key_),
                           v.type_name()));
        }
        return Role::ignored;
      case Role::shape:
        if (++facts_.rank <= kMaxRank && !facts_.bad_dim) {
          if (v.kind == Kind::unsigned_int && v.u <= kInt64Max) {
            facts_.entry.shape.push_back(static_cast<std::int64_t>(v.u));
          } else {
            facts_.bad_dim = std::move(v);
          }
        }
        return Role::ignored;
      case Role::offsets:
        if (facts_.offsets_count < 2) facts_.offsets[facts_.offsets_count] = std::move(v);
        ++facts_.offsets_count;
        return Role::ignored;
      case Role::ignored:
        return Role::ignored;
    }
    return Role::ignored;
  }

  std::uint64_t data_buffer_size_;
  SafetensorsHeader& out_;
  std::vector<Frame> frames_;  // the open containers, outermost first
  std::size_t open_objects_ = 0;
  std::size_t tensors_ = 0;  // keys of the root object other than __metadata__
  std::string key_;          // the last key read
  Kind root_kind_ = Kind::null;
  EntryFacts facts_;  // the entry being read
  std::optional<std::tuple<std::string, std::string, std::string>> first_problem_;
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
      fail(label, fmt::format("{}: data_offsets [{}, {}] overlap {} [{}, {}]",
                              tensor_named(entry->name), entry->begin, entry->end,
                              tensor_named(previous->name), previous->begin, previous->end));
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

}  // namespace

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
  SafetensorsHeader header;
  HeaderParser parser(data_buffer_size, header);
  const auto* begin = reinterpret_cast<const char*>(json_bytes.data());
  if (!json::sax_parse(begin, begin + json_bytes.size(), &parser)) {
    fail(label, parser.structure_problem.empty() ? std::string("header is not valid JSON")
                                                 : parser.structure_problem);
  }
  if (const auto problem = parser.content_problem()) fail(label, *problem);
  std::sort(header.entries.begin(), header.entries.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  check_coverage(header.entries, data_buffer_size, label);
  return header;
}

}  // namespace detlogp::io
