#pragma once
// Shared helpers of the io tests: a scratch directory per test, raw file writing, and an
// assertion that a call throws ContractError with a one-line message naming the file.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "detlogp/errors.hpp"
#include "io/tensor.hpp"

namespace detlogp::io::testing {

class ScratchDir {
 public:
  ScratchDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("detlogp_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }
  const std::filesystem::path& path() const { return path_; }
  // Every entry in the directory (temp files included), sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& entry : std::filesystem::directory_iterator(path_)) {
      out.push_back(entry.path().filename().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::filesystem::path path_;
};

inline std::vector<std::byte> bytes_of(std::string_view text) {
  std::vector<std::byte> out(text.size());
  if (!text.empty()) std::memcpy(out.data(), text.data(), text.size());
  return out;
}

inline std::string string_of(std::span<const std::byte> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

inline void write_file(const std::filesystem::path& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline std::string le64(std::uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

// A safetensors file: length prefix + header + data.
inline std::string safetensors_bytes(std::string_view header, std::string_view data) {
  return le64(header.size()) + std::string(header) + std::string(data);
}

// Expects `call` to throw ContractError whose message is one line, starts with `label` + ": "
// and contains `fragment`.
inline void expect_contract_error(const std::function<void()>& call, std::string_view label,
                                  std::string_view fragment) {
  try {
    call();
    ADD_FAILURE() << "no ContractError; expected one containing '" << fragment << "'";
  } catch (const ContractError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(message.rfind(std::string(label) + ": ", 0), 0u)
        << "message does not start with the file: " << message;
    EXPECT_NE(message.find(fragment), std::string::npos)
        << "message lacks '" << fragment << "': " << message;
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected ContractError, got another exception: " << error.what();
  }
}

template <class T>
std::vector<T> values_of(const Tensor& tensor) {
  std::vector<T> out(tensor.data.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), tensor.data.data(), tensor.data.size());
  return out;
}

// A tensor of `dtype` and `shape` whose bytes are a deterministic pattern (valid for every
// dtype: BOOL bytes are 0/1).
inline Tensor pattern_tensor(std::string name, TensorDType dtype, std::vector<std::int64_t> shape) {
  Tensor tensor{std::move(name), dtype, std::move(shape), {}};
  const auto bytes = checked_nbytes(tensor.shape, dtype);
  tensor.data.resize(static_cast<std::size_t>(*bytes));
  for (std::size_t i = 0; i < tensor.data.size(); ++i) {
    tensor.data[i] =
        static_cast<std::byte>(dtype == TensorDType::BOOL ? (i * 7 + 3) % 2 : (i * 37 + 11) % 251);
  }
  return tensor;
}

inline constexpr TensorDType kAllDTypes[] = {TensorDType::F32, TensorDType::F16, TensorDType::BF16,
                                             TensorDType::I64, TensorDType::I32, TensorDType::BOOL,
                                             TensorDType::U8};

inline const std::vector<std::vector<std::int64_t>>& test_shapes() {
  static const std::vector<std::vector<std::int64_t>> shapes{{},  {5},    {2, 3},
                                                             {0}, {3, 0}, {2, 1, 4}};
  return shapes;
}

// A bad file of a format's tests: the fragment its error must contain.
struct BadCase {
  std::string name;
  std::string bytes;
  std::string fragment;
};

// Every case refused with a ContractError naming the input, both from a file
// (<name><extension>, through each of `readers`) and from memory (`parse(bytes, label)`).
template <class Parse>
void expect_every_case_refused(
    const std::vector<BadCase>& cases, std::string_view extension,
    const std::vector<std::function<void(const std::filesystem::path&)>>& readers, Parse&& parse) {
  ScratchDir dir;
  for (const auto& bad : cases) {
    SCOPED_TRACE(bad.name);
    const auto path = dir / (bad.name + std::string(extension));
    write_file(path, bad.bytes);
    for (const auto& read : readers) {
      expect_contract_error([&] { read(path); }, path.string(), bad.fragment);
    }
    const std::string label = "mem" + std::string(extension);
    expect_contract_error([&] { parse(bytes_of(bad.bytes), label); }, label, bad.fragment);
  }
}

}  // namespace detlogp::io::testing
