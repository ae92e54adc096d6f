#include "io/npy.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/tensor_file.hpp"
#include "io_test_util.hpp"

namespace detlogp::io {
namespace {

using namespace testing;  // io_test_util.hpp

const std::string kMagic = "\x93NUMPY";

std::string f32_bytes(std::initializer_list<float> values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), std::data(values), out.size());
  return out;
}

// An npy file of format `major`.0 holding `dict`, padded with spaces and a newline so the data
// starts at a multiple of `align`.
std::string npy_file(int major, std::string_view dict, std::string_view data,
                     std::size_t align = 64) {
  const std::size_t preamble = major == 1 ? 10 : 12;
  std::string header(dict);
  while ((preamble + header.size() + 1) % align != 0) header += ' ';
  header += '\n';
  std::string out = kMagic + static_cast<char>(major) + '\0';
  for (std::size_t i = 0; i < preamble - 8; ++i) {
    out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  }
  return out + header + std::string(data);
}

const std::string kDict23 = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
const std::string kData23 = f32_bytes({0, 1, 2, 3, 4, 5});

// numpy.save(f, np.arange(6, dtype='<f4').reshape(2, 3)): the well-known "v\x00" header of 118
// bytes, so the data starts at byte 128.
TEST(NpyGolden, ReadsNumpyBytesAndWritesTheSame) {
  const std::string golden = npy_file(1, kDict23, kData23);
  ASSERT_EQ(golden.substr(0, 10), kMagic + std::string("\x01\x00v\x00", 4));
  ASSERT_EQ(golden.size(), 128u + 24u);
  const Tensor t = parse_npy(bytes_of(golden), "golden.npy", "g");
  EXPECT_EQ(t.name, "g");
  EXPECT_EQ(t.dtype, TensorDType::F32);
  EXPECT_EQ(t.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(values_of<float>(t), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  // Our writer adds numpy's spare room for growing shape[0] (21 - len("2") spaces) before the
  // padding, which here lands on the same 118-byte header.
  EXPECT_EQ(string_of(serialize_npy(t.ref())), golden);

  const std::string golden_1d =
      npy_file(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
               std::string("\x01\0\0\0\0\0\0\0\x02\0\0\0\0\0\0\0\x03\0\0\0\0\0\0\0", 24));
  const Tensor t1 = parse_npy(bytes_of(golden_1d), "golden_1d.npy");
  EXPECT_EQ(values_of<std::int64_t>(t1), (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_EQ(string_of(serialize_npy(t1.ref())), golden_1d);

  const std::string golden_0d =
      npy_file(1, "{'descr': '|b1', 'fortran_order': False, 'shape': (), }", "\x01");
  const Tensor t0 = parse_npy(bytes_of(golden_0d), "golden_0d.npy");
  EXPECT_TRUE(t0.shape.empty());
  EXPECT_EQ(t0.dtype, TensorDType::BOOL);
  EXPECT_EQ(string_of(serialize_npy(t0.ref())), golden_0d);
}

TEST(NpyReader, AcceptsEveryVersionAndNumpysLiteralVariants) {
  const std::vector<std::pair<std::string, std::string>> variants{
      {"v2", npy_file(2, kDict23, kData23)},
      {"v3", npy_file(3, kDict23, kData23)},
      {"align16", npy_file(1, kDict23, kData23, 16)},
      {"py2_longs",
       npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", kData23)},
      {"double_quotes_reordered_no_trailing_comma",
       npy_file(1, "{\"shape\": (2,3), \"fortran_order\": False, \"descr\": \"<f4\"}", kData23)},
      {"extra_whitespace",
       npy_file(1, "  {\n'descr' :'<f4' ,\t'fortran_order':False,'shape':( 2 , 3 , ) ,}", kData23)},
  };
  for (const auto& [name, bytes] : variants) {
    SCOPED_TRACE(name);
    const Tensor t = parse_npy(bytes_of(bytes), name);
    EXPECT_EQ(t.shape, (std::vector<std::int64_t>{2, 3}));
    EXPECT_EQ(values_of<float>(t), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  }
}

TEST(NpyRoundTrip, EveryDTypeAndShape) {
  ScratchDir dir;
  for (TensorDType dtype : testing::kAllDTypes) {
    if (dtype == TensorDType::BF16) continue;
    for (const auto& shape : testing::test_shapes()) {
      const Tensor original = pattern_tensor("logits", dtype, shape);
      const std::string what = std::string(dtype_name(dtype)) + " " + format_shape(shape);
      const auto path = dir / "logits.npy";
      write_npy(path, original.ref());
      const std::string file = testing::read_file(path);
      EXPECT_EQ(read_npy_header(path).data_offset % 64, 0u) << what;
      for (const Tensor& read :
           {read_npy(path), read_tensor(path), parse_npy(bytes_of(file), "mem", "logits")}) {
        EXPECT_EQ(read.name, "logits") << what;
        EXPECT_EQ(read.dtype, dtype) << what;
        EXPECT_EQ(read.shape, shape) << what;
        EXPECT_EQ(read.data, original.data) << what;
      }
      EXPECT_EQ(read_tensor(path, "other").name, "other");
    }
  }
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"logits.npy"}));
}

std::string dict_with(std::string_view descr, std::string_view order, std::string_view shape) {
  return "{'descr': " + std::string(descr) + ", 'fortran_order': " + std::string(order) +
         ", 'shape': " + std::string(shape) + ", }";
}

std::vector<BadCase> bad_cases() {
  const std::string le32_huge("\xff\xff\xff\xff", 4);
  std::string many_dims = "(1";
  for (int i = 1; i < 65; ++i) many_dims += ", 1";
  many_dims += ")";
  return {
      {"empty", "", "file is empty"},
      {"bad_magic", "GARBAGE_NOT_NPY_FILE", "not an .npy file: bad magic"},
      {"safetensors_bytes", testing::safetensors_bytes("{}", ""), "bad magic"},
      {"short", "\x93NUM", "file is 4 bytes, too short for the npy preamble"},
      {"v2_short", kMagic + std::string("\x02\x00\x00\x00", 4), "too short for the npy 2.0"},
      {"version_4", kMagic + std::string("\x04\x00\x10\x00", 4) + std::string(16, ' '),
       "unsupported npy format version 4.0"},
      {"version_1_1", kMagic + std::string("\x01\x01\x10\x00", 4) + std::string(16, ' '),
       "unsupported npy format version 1.1"},
      {"header_past_end", kMagic + std::string("\x01\x00\x88\x13", 4) + "{}",
       "header length 5000 exceeds the file size 12"},
      {"v2_header_huge", kMagic + std::string("\x02\x00", 2) + le32_huge + "{}",
       "header length 4294967295 exceeds the file size"},
      {"fortran", npy_file(1, dict_with("'<f4'", "True", "(2, 3)"), kData23),
       "fortran_order True (column-major data) is not supported"},
      {"fortran_other", npy_file(1, dict_with("'<f4'", "0", "(2, 3)"), kData23),
       "fortran_order must be False"},
      {"descr_f8", npy_file(1, dict_with("'<f8'", "False", "(3,)"), kData23),
       "unsupported descr '<f8' (supported: <f4, <f2, <i8, <i4, |b1, |u1)"},
      {"descr_big_endian", npy_file(1, dict_with("'>f4'", "False", "(2, 3)"), kData23),
       "big-endian descr '>f4' is not supported"},
      {"descr_bf16_void", npy_file(1, dict_with("'<V2'", "False", "(12,)"), kData23),
       "unsupported descr '<V2'"},
      {"descr_structured", npy_file(1, dict_with("[('a', '<f4')]", "False", "(6,)"), kData23),
       "structured dtypes"},
      {"descr_not_string", npy_file(1, dict_with("4", "False", "(6,)"), kData23),
       "expected a quoted descr string"},
      {"missing_shape", npy_file(1, "{'descr': '<f4', 'fortran_order': False, }", kData23),
       "header lacks 'shape'"},
      {"missing_descr", npy_file(1, "{'fortran_order': False, 'shape': (6,), }", kData23),
       "header lacks 'descr'"},
      {"extra_key",
       npy_file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'foo': 1, }", kData23),
       "unexpected header key 'foo'"},
      {"duplicate_key",
       npy_file(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,), }",
                kData23),
       "header repeats 'descr'"},
      {"shape_not_tuple", npy_file(1, dict_with("'<f4'", "False", "(6)"), kData23),
       "'shape' must be a tuple"},
      {"shape_list", npy_file(1, dict_with("'<f4'", "False", "[2, 3]"), kData23),
       "'shape' must be a tuple"},
      {"shape_negative", npy_file(1, dict_with("'<f4'", "False", "(-2, 3)"), kData23),
       "negative dimension"},
      {"shape_float", npy_file(1, dict_with("'<f4'", "False", "(2.0, 3)"), kData23),
       "expected ',' or ')'"},
      {"shape_too_large",
       npy_file(1, dict_with("'<f4'", "False", "(99999999999999999999,)"), kData23),
       "too large for int64"},
      {"shape_overflow",
       npy_file(1, dict_with("'<f4'", "False", "(4294967296, 4294967296, 4)"), kData23),
       "overflows 64-bit byte sizes"},
      {"too_many_dims", npy_file(1, dict_with("'|u1'", "False", many_dims), "x"),
       "more than 64 dimensions"},
      {"truncated_data", npy_file(1, kDict23, kData23.substr(0, 20)),
       "data is truncated: shape (2, 3) of <f4 needs 24 bytes but the file holds 20"},
      {"no_data", npy_file(1, kDict23, ""), "needs 24 bytes but the file holds 0"},
      {"declared_huge", npy_file(1, dict_with("'<f4'", "False", "(1000000000000,)"), "abcd"),
       "needs 4000000000000 bytes but the file holds 4"},
      {"trailing_data", npy_file(1, kDict23, kData23 + "abcd"), "(4 trailing bytes)"},
      {"non_ascii",
       npy_file(1, "{'descr': '<f4\xff', 'fortran_order': False, 'shape': (6,), }", kData23),
       "header holds the byte 0xff"},
      {"nul_byte", npy_file(1, std::string("{'descr': '<f4'\0, }", 19), kData23),
       "header holds the byte 0x00"},
      {"unterminated",
       npy_file(1, "{'descr': '<f4, 'fortran_order': False, 'shape': (6,)}", kData23),
       "unsupported descr '<f4, '"},
      {"unterminated_end", npy_file(1, "{'descr", kData23), "unterminated string"},
      {"escape", npy_file(1, dict_with("'<f\\x34'", "False", "(6,)"), kData23), "escape sequences"},
      {"garbage_after", npy_file(1, kDict23 + " x", kData23),
       "unexpected text after the header dict"},
      {"not_dict", npy_file(1, "('descr', '<f4')", kData23), "expected the header dict to start"},
      {"unclosed_dict", npy_file(1, "{'descr': '<f4'", kData23), "expected ',' or '}'"},
  };
}

TEST(NpyBadInput, EveryCaseIsAContractErrorNamingTheFile) {
  expect_every_case_refused(
      bad_cases(), ".npy",
      {[](const auto& path) { read_npy(path); }, [](const auto& path) { read_tensor(path); }},
      [](std::span<const std::byte> bytes, const std::string& label) { parse_npy(bytes, label); });
  ScratchDir dir;
  const auto missing = dir / "missing.npy";
  expect_contract_error([&] { read_npy(missing); }, missing.string(), "file not found");
}

TEST(NpyWriterFailures, LeaveNothingBehind) {
  ScratchDir dir;
  const auto out = dir / "out.npy";
  const Tensor bf16 = pattern_tensor("logits", TensorDType::BF16, {2, 2});
  expect_contract_error([&] { write_npy(out, bf16.ref()); }, out.string(),
                        "tensor 'logits' has dtype BF16, which .npy cannot hold");
  Tensor short_data = pattern_tensor("x", TensorDType::I64, {3});
  short_data.data.resize(16);
  expect_contract_error([&] { write_npy(out, short_data.ref()); }, out.string(),
                        "shape [3] of I64 needs 24 bytes but the data holds 16");
  const auto in_missing_dir = dir / "nope" / "out.npy";
  const Tensor good = pattern_tensor("x", TensorDType::U8, {3});
  expect_contract_error([&] { write_npy(in_missing_dir, good.ref()); }, in_missing_dir.string(),
                        "does not exist");
  const std::vector<TensorRef> two{good.ref(), good.ref()};
  expect_contract_error([&] { write_tensors(out, two); }, out.string(),
                        "an .npy file holds exactly one tensor, got 2");
  const std::vector<TensorRef> one{good.ref()};
  expect_contract_error(
      [&] {
        write_tensors(out, one, {{"k", "v"}});
      },
      out.string(), "cannot hold metadata");
  const auto pt = dir / "out.pt";
  expect_contract_error([&] { write_tensors(pt, one); }, pt.string(), "unsupported file extension");
  EXPECT_TRUE(dir.entries().empty());
  write_tensors(out, one);
  EXPECT_EQ(read_tensor(out).data, good.data);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"out.npy"}));
}

}  // namespace
}  // namespace detlogp::io
