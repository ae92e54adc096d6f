#include "io/safetensors.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/tensor_file.hpp"
#include "io_test_util.hpp"

namespace detlogp::io {
namespace {

using namespace testing;  // io_test_util.hpp

const std::string kI32Data("\x01\0\0\0\x02\0\0\0\x03\0\0\0\x04\0\0\0", 16);

// The byte strings of the reference implementation's own tests (huggingface/safetensors,
// bindings/python/tests/test_simple.py): unpadded (older writers), padded to 8 with spaces, and
// with metadata.
TEST(SafetensorsGolden, ReadsReferenceBytes) {
  const std::string header = R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})";
  for (const std::string& file :
       {safetensors_bytes(header, kI32Data), safetensors_bytes(header + "    ", kI32Data)}) {
    ASSERT_TRUE(file[0] == '<' || file[0] == '@');
    const auto contents = parse_safetensors(bytes_of(file), "golden");
    ASSERT_EQ(contents.tensors.size(), 1u);
    const Tensor& t = contents.tensors[0];
    EXPECT_EQ(t.name, "test");
    EXPECT_EQ(t.dtype, TensorDType::I32);
    EXPECT_EQ(t.shape, (std::vector<std::int64_t>{2, 2}));
    EXPECT_EQ(values_of<std::int32_t>(t), (std::vector<std::int32_t>{1, 2, 3, 4}));
    EXPECT_TRUE(contents.metadata.empty());
  }
  const std::string with_metadata =
      std::string("f\0\0\0\0\0\0\0", 8) +
      R"({"__metadata__":{"framework":"pt"},"test1":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})"
      "       " +
      std::string(16, '\0');
  const auto contents = parse_safetensors(bytes_of(with_metadata), "golden");
  ASSERT_EQ(contents.tensors.size(), 1u);
  EXPECT_EQ(contents.tensors[0].name, "test1");
  EXPECT_EQ(contents.metadata.at("framework"), "pt");
}

TEST(SafetensorsWriter, WritesSortedCompactPaddedHeader) {
  const Tensor t = make_tensor<std::int32_t>("test", TensorDType::I32, {2, 2},
                                             std::vector<std::int32_t>{1, 2, 3, 4});
  const std::vector<TensorRef> refs{t.ref()};
  const std::string out = string_of(serialize_safetensors(refs));
  const std::string header = R"({"test":{"data_offsets":[0,16],"dtype":"I32","shape":[2,2]}})";
  EXPECT_EQ(out, safetensors_bytes(header + "    ", kI32Data));
}

TEST(SafetensorsWriter, AlignsDataByItemsizeAndKeepsMetadata) {
  const std::vector<Tensor> tensors{pattern_tensor("b_mask", TensorDType::BOOL, {3}),
                                    pattern_tensor("a_half", TensorDType::F16, {3}),
                                    pattern_tensor("c_long", TensorDType::I64, {2}),
                                    pattern_tensor("d_float", TensorDType::F32, {1})};
  ScratchDir dir;
  const auto path = dir / "multi.safetensors";
  write_safetensors(path, tensors, {{"producer", "detlogp"}, {"a", "b"}});
  const auto header = read_safetensors_header(path);
  EXPECT_EQ(header.data_start % 8, 0u);
  EXPECT_EQ(header.names(), (std::vector<std::string>{"a_half", "b_mask", "c_long", "d_float"}));
  for (const auto& entry : header.entries) {
    EXPECT_EQ(entry.begin % itemsize(entry.dtype), 0u) << entry.name;
  }
  EXPECT_EQ(header.find("c_long")->begin, 0u);  // largest itemsize first
  const auto contents = read_safetensors(path);
  EXPECT_EQ(contents.metadata, (Metadata{{"a", "b"}, {"producer", "detlogp"}}));
  for (const auto& original : tensors) {
    const Tensor* read = contents.find(original.name);
    ASSERT_NE(read, nullptr) << original.name;
    EXPECT_EQ(read->dtype, original.dtype);
    EXPECT_EQ(read->shape, original.shape);
    EXPECT_EQ(read->data, original.data);
  }
  const std::string text = testing::read_file(path);
  EXPECT_EQ(text.substr(8, 17), R"({"__metadata__":{)");
}

TEST(SafetensorsRoundTrip, EveryDTypeAndShape) {
  ScratchDir dir;
  for (TensorDType dtype : testing::kAllDTypes) {
    for (const auto& shape : testing::test_shapes()) {
      const Tensor original = pattern_tensor("x", dtype, shape);
      const std::string what = std::string(dtype_name(dtype)) + " " + format_shape(shape);
      const auto path = dir / "t.safetensors";
      write_safetensors(path, std::vector<Tensor>{original});
      for (const Tensor& read :
           {read_safetensors_tensor(path), read_safetensors_tensor(path, "x"), read_tensor(path),
            parse_safetensors(bytes_of(testing::read_file(path)), "mem").tensors.at(0)}) {
        EXPECT_EQ(read.name, "x") << what;
        EXPECT_EQ(read.dtype, dtype) << what;
        EXPECT_EQ(read.shape, shape) << what;
        EXPECT_EQ(read.data, original.data) << what;
      }
    }
  }
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"t.safetensors"}));  // no temp files left
}

TEST(SafetensorsSelect, ByNameOnlyTensorOrListsNames) {
  ScratchDir dir;
  const auto two = dir / "two.safetensors";
  write_safetensors(two, std::vector<Tensor>{pattern_tensor("logits", TensorDType::F32, {2, 2}),
                                             pattern_tensor("targets", TensorDType::I64, {2})});
  EXPECT_EQ(read_safetensors_tensor(two, "targets").dtype, TensorDType::I64);
  EXPECT_EQ(read_tensor(two, "logits").shape, (std::vector<std::int64_t>{2, 2}));
  expect_contract_error([&] { read_safetensors_tensor(two); }, two.string(),
                        "holds 2 tensors ('logits', 'targets')");
  expect_contract_error([&] { read_safetensors_tensor(two, "mask"); }, two.string(),
                        "no tensor named 'mask'; the file holds 2 tensors: 'logits', 'targets'");
  const auto one = dir / "one.safetensors";
  write_safetensors(one, std::vector<Tensor>{pattern_tensor("whatever", TensorDType::U8, {4})});
  EXPECT_EQ(read_safetensors_tensor(one, "mask").name, "whatever");
  const auto none = dir / "none.safetensors";
  write_safetensors(none, std::vector<Tensor>{});
  EXPECT_EQ(testing::read_file(none), safetensors_bytes("{}      ", ""));
  expect_contract_error([&] { read_safetensors_tensor(none); }, none.string(), "holds no tensors");
}

std::string entry_file(std::string_view entry, std::string_view data) {
  return safetensors_bytes(std::string(R"({"t":)") + std::string(entry) + "}", data);
}

std::string many_dims_entry(int rank) {
  std::string shape = "1";
  for (int i = 1; i < rank; ++i) shape += ",1";
  return R"({"dtype":"U8","shape":[)" + shape + R"(],"data_offsets":[0,1]})";
}

// Entries of the one tensor 't' over 16 data bytes, each breaking one rule of an entry.
struct BadEntry {
  std::string name;
  std::string entry;  // the JSON of tensor 't'
  std::string fragment;
};

std::vector<BadCase> bad_entries_over_16_bytes() {
  const std::vector<BadEntry> entries = {
      {"missing_dtype", R"({"shape":[4],"data_offsets":[0,16]})", "tensor 't': missing 'dtype'"},
      {"missing_shape", R"({"dtype":"I32","data_offsets":[0,16]})", "missing 'shape'"},
      {"missing_offsets", R"({"dtype":"I32","shape":[4]})", "missing 'data_offsets'"},
      {"extra_key", R"({"dtype":"I32","shape":[4],"data_offsets":[0,16],"x":1})",
       "unexpected key 'x'"},
      {"dtype_not_string", R"({"dtype":4,"shape":[4],"data_offsets":[0,16]})",
       "'dtype' must be a string, got number"},
      {"unknown_dtype", R"({"dtype":"F64","shape":[2],"data_offsets":[0,16]})",
       "unsupported dtype 'F64'"},
      {"shape_not_array", R"({"dtype":"I32","shape":"4","data_offsets":[0,16]})",
       "'shape' must be an array, got string"},
      {"shape_float", R"({"dtype":"I32","shape":[4.0],"data_offsets":[0,16]})",
       "shape entries must be integers"},
      {"shape_bool", R"({"dtype":"I32","shape":[true],"data_offsets":[0,16]})",
       "shape entries must be integers, got boolean"},
      {"negative_dim", R"({"dtype":"I32","shape":[-1,4],"data_offsets":[0,16]})",
       "negative dimension -1"},
      {"dim_too_large", R"({"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,16]})",
       "dimension 18446744073709551615 is too large"},
      {"dim_beyond_uint64",
       R"({"dtype":"U8","shape":[99999999999999999999999],"data_offsets":[0,16]})",
       "shape entries must be integers"},
      {"overflow", R"({"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,16]})",
       "overflows 64-bit byte sizes"},
      {"offsets_not_pair", R"({"dtype":"I32","shape":[4],"data_offsets":[0]})",
       "'data_offsets' must be an array [begin, end], got 1 elements"},
      {"offsets_strings", R"({"dtype":"I32","shape":[4],"data_offsets":["0",16]})",
       "data_offsets must be non-negative integers, got string"},
      {"offsets_negative", R"({"dtype":"I32","shape":[4],"data_offsets":[-4,16]})",
       "non-negative integers, got -4"},
      {"offsets_reversed", R"({"dtype":"I32","shape":[0],"data_offsets":[16,0]})",
       "end before they begin"},
  };
  std::vector<BadCase> cases;
  for (const BadEntry& e : entries) {
    cases.push_back({e.name, entry_file(e.entry, std::string(16, '\0')), e.fragment});
  }
  return cases;
}

std::vector<BadCase> bad_cases() {
  std::vector<BadCase> cases = {
      {"empty", "", "file is empty"},
      {"short", "abc", "file is 3 bytes, too short"},
      {"length_past_end", le64(9999999) + "{}" + std::string(110, ' '),
       "header length 9999999 exceeds the file size 120"},
      {"length_huge", le64(~0ull) + "{}", "exceeds the file size"},
      {"length_zero", le64(0) + "{}", "header length 0 is too small"},
      {"truncated_header", le64(40) + R"({"t":{"dtype")", "header length 40 exceeds the file"},
      {"bad_json", safetensors_bytes("{abc", ""), "header is not valid JSON"},
      {"trailing_garbage", safetensors_bytes("{} x", ""), "header is not valid JSON"},
      {"nul_padding", safetensors_bytes(std::string("{}\0\0", 4), ""), "not valid JSON"},
      {"not_object", safetensors_bytes("[1,2]", ""), "header must be a JSON object, got array"},
      {"invalid_utf8", safetensors_bytes("{\"\xff\":1}", ""), "not valid JSON"},
      {"duplicate_key",
       entry_file(R"({"dtype":"U8","dtype":"U8","shape":[0],"data_offsets":[0,0]})", ""),
       "repeats the key 'dtype'"},
      {"deep", safetensors_bytes(R"({"t":[[[[[[[[[[[[1]]]]]]]]]]]]})", ""), "nests deeper"},
      {"entry_not_object", entry_file("1", ""), "tensor 't': entry must be a JSON object"},
      {"too_many_dims", entry_file(many_dims_entry(65), "x"), "rank 65 exceeds the limit of 64"},
      {"size_mismatch",
       entry_file(R"({"dtype":"I32","shape":[2,2],"data_offsets":[0,12]})", std::string(12, '\0')),
       "data_offsets [0, 12] hold 12 bytes but shape [2, 2] of I32 needs 16"},
      {"past_buffer",
       entry_file(R"({"dtype":"I32","shape":[2,2],"data_offsets":[0,16]})", std::string(8, '\0')),
       "data_offsets [0, 16] exceed the data buffer of 8 bytes"},
      {"declared_huge",
       entry_file(R"({"dtype":"U8","shape":[4000000000],"data_offsets":[0,4000000000]})", "xy"),
       "exceed the data buffer of 2 bytes"},
      {"overlap",
       safetensors_bytes(
           R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
           "123456"),
       "tensor 'b': data_offsets [2, 6] overlap tensor 'a' [0, 4]"},
      {"gap",
       safetensors_bytes(
           R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
           "123456"),
       "bytes [2, 4) of the data buffer belong to no tensor"},
      {"trailing_data", entry_file(R"({"dtype":"U8","shape":[2],"data_offsets":[0,2]})", "1234"),
       "the data buffer holds 4 bytes but the tensors cover only 2"},
      {"metadata_not_object", safetensors_bytes(R"({"__metadata__":[]})", ""),
       "__metadata__ must be an object"},
      {"metadata_value", safetensors_bytes(R"({"__metadata__":{"k":1}})", ""),
       "__metadata__ value for 'k' must be a string"},
      {"control_chars_in_name",
       safetensors_bytes("{\"a\\nb\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,0]}}", ""),
       "tensor 'a\\x0ab': unsupported dtype 'X'"},
  };
  const std::vector<BadCase> entries = bad_entries_over_16_bytes();
  cases.insert(cases.end(), entries.begin(), entries.end());
  return cases;
}

TEST(SafetensorsBadInput, EveryCaseIsAContractErrorNamingTheFile) {
  expect_every_case_refused(bad_cases(), ".safetensors",
                            {[](const auto& path) { read_safetensors_tensor(path); },
                             [](const auto& path) { read_tensor(path, "t"); }},
                            [](std::span<const std::byte> bytes, const std::string& label) {
                              parse_safetensors(bytes, label);
                            });
}

// Of several problems, the message names the first key in name order (and, within an entry, the
// first rule), whatever the order of the JSON text; the structure comes before any of them.
TEST(SafetensorsBadInput, FirstProblemInNameOrder) {
  const auto refuse = [](const std::string& header, std::string_view fragment) {
    expect_contract_error(
        [&] { parse_safetensors(bytes_of(safetensors_bytes(header, "")), "mem.safetensors"); },
        "mem.safetensors", fragment);
  };
  const std::string bad_dtype = R"({"dtype":"F64","shape":[0],"data_offsets":[0,0]})";
  const std::string bad_shape = R"({"dtype":"F32","shape":[-1],"data_offsets":[0,0]})";
  refuse(R"({"b":)" + bad_dtype + R"(,"a":)" + bad_shape + "}",
         "tensor 'a': shape has a negative dimension -1");
  refuse(R"({"a":)" + bad_shape + R"(,"b":)" + bad_dtype + "}",
         "tensor 'a': shape has a negative dimension -1");
  refuse(R"({"z":)" + bad_dtype + R"(,"__metadata__":{"y":1,"x":[]}})",
         "__metadata__ value for 'x' must be a string, got array");
  refuse(R"({"t":{"shape":"s","extra":1,"dtype":2}})",
         "tensor 't': unexpected key 'extra' (expected dtype, shape, data_offsets)");
  refuse(R"({"t":{"shape":"s","dtype":2,"data_offsets":[0,0]}})",
         "tensor 't': 'dtype' must be a string, got number");
  refuse(R"({"a":)" + bad_dtype + R"(,"a":{}})", "header JSON repeats the key 'a'");
}

TEST(SafetensorsBadInput, MissingFileDirectoryAndExtension) {
  ScratchDir dir;
  const auto missing = dir / "missing.safetensors";
  expect_contract_error([&] { read_safetensors_tensor(missing); }, missing.string(),
                        "file not found");
  expect_contract_error([&] { read_tensor(missing); }, missing.string(), "file not found");
  const auto in_missing_dir = dir / "nope" / "x.safetensors";
  expect_contract_error([&] { read_tensor(in_missing_dir); }, in_missing_dir.string(),
                        "file not found");
  const auto a_dir = dir / "d.safetensors";
  std::filesystem::create_directory(a_dir);
  expect_contract_error([&] { read_tensor(a_dir); }, a_dir.string(), "is a directory");
  const auto fifo = dir / "fifo.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_contract_error([&] { read_tensor(fifo); }, fifo.string(), "is not a regular file");
  const auto pt = dir / "logits.pt";
  write_file(pt, "x");
  expect_contract_error([&] { read_tensor(pt); }, pt.string(),
                        "unsupported file extension '.pt' (expected .safetensors or .npy)");
  expect_contract_error([&] { read_tensor(dir / "logits"); }, (dir / "logits").string(),
                        "no file extension");
}

TEST(SafetensorsWriterFailures, LeaveNothingBehind) {
  ScratchDir dir;
  const Tensor good = pattern_tensor("a", TensorDType::F32, {2});
  Tensor bad = pattern_tensor("b", TensorDType::F32, {2});
  bad.data.pop_back();

  const auto in_missing_dir = dir / "nope" / "out.safetensors";
  expect_contract_error([&] { write_safetensors(in_missing_dir, std::vector<Tensor>{good}); },
                        in_missing_dir.string(), "directory");
  const auto out = dir / "out.safetensors";
  expect_contract_error(
      [&] {
        write_safetensors(out, std::vector<Tensor>{good, bad});
      },
      out.string(), "tensor 'b': shape [2] of F32 needs 8 bytes but the data holds 7");
  expect_contract_error(
      [&] {
        write_safetensors(out, std::vector<Tensor>{good, good});
      },
      out.string(), "two tensors are named 'a'");
  Tensor reserved = good;
  reserved.name = "__metadata__";
  expect_contract_error([&] { write_safetensors(out, std::vector<Tensor>{reserved}); },
                        out.string(), "reserved");
  Tensor bad_utf8 = good;
  bad_utf8.name = "\xff";
  expect_contract_error([&] { write_safetensors(out, std::vector<Tensor>{bad_utf8}); },
                        out.string(), "valid UTF-8");
  Tensor negative = good;
  negative.shape = {-2};
  expect_contract_error([&] { write_safetensors(out, std::vector<Tensor>{negative}); },
                        out.string(), "negative dimension");
  const auto a_dir = dir / "adir.safetensors";
  std::filesystem::create_directory(a_dir);
  expect_contract_error([&] { write_safetensors(a_dir, std::vector<Tensor>{good}); },
                        a_dir.string(), "is an existing directory");
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"adir.safetensors"}));

  // A failed write over an existing file keeps the old contents.
  write_safetensors(out, std::vector<Tensor>{good});
  const std::string before = testing::read_file(out);
  expect_contract_error([&] { write_safetensors(out, std::vector<Tensor>{bad}); }, out.string(),
                        "needs 8 bytes");
  EXPECT_EQ(testing::read_file(out), before);
  // A successful write replaces it.
  write_safetensors(out, std::vector<Tensor>{pattern_tensor("c", TensorDType::U8, {3})});
  EXPECT_EQ(read_safetensors_tensor(out).name, "c");
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"adir.safetensors", "out.safetensors"}));
}

TEST(SafetensorsWriterFailures, UnwritableDirectoryIsAnEnvironmentError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  ScratchDir dir;
  const auto locked = dir / "locked";
  std::filesystem::create_directory(locked);
  std::filesystem::permissions(
      locked, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  const Tensor good = pattern_tensor("a", TensorDType::F32, {2});
  EXPECT_THROW(write_safetensors(locked / "x.safetensors", std::vector<Tensor>{good}),
               std::runtime_error);
  std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
  EXPECT_TRUE(std::filesystem::is_empty(locked));
}

}  // namespace
}  // namespace detlogp::io
