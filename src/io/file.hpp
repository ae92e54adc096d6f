#pragma once
// File access for the io layer: a checked reader (sizes come from fstat, reads are bounded by
// them) and an atomic writer (temp file in the target's directory, fsync, rename; the temp file
// is removed on any failure, so a reader never sees a partial output).
//
// Errors: a missing file or directory, or a path that is not a regular file, is an input problem
// (ContractError); anything else the system refuses (permissions, disk full, I/O errors) is an
// environment failure (std::runtime_error). Messages start with the path.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace detlogp::io {

class InputFile {
 public:
  explicit InputFile(const std::filesystem::path& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& label() const { return label_; }
  std::uint64_t size() const { return size_; }
  // Fills `out` from `offset`; ContractError if the file ends first (it changed while reading).
  void read_at(std::uint64_t offset, std::span<std::byte> out) const;

 private:
  std::string label_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

class AtomicOutputFile {
 public:
  // Creates "<dir>/.<name>.tmp-XXXXXXXX" with mode 0666 & ~umask.
  explicit AtomicOutputFile(const std::filesystem::path& path);
  // Removes the temp file unless commit() succeeded.
  ~AtomicOutputFile();
  AtomicOutputFile(const AtomicOutputFile&) = delete;
  AtomicOutputFile& operator=(const AtomicOutputFile&) = delete;

  const std::string& label() const { return label_; }
  void write(std::span<const std::byte> bytes);
  // fsync, close, rename over the target, fsync the directory.
  void commit();

 private:
  void discard() noexcept;

  std::filesystem::path path_;
  std::filesystem::path temp_path_;
  std::string label_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace detlogp::io
