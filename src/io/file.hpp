#pragma once
// File access for the io layer: a checked reader (sizes come from fstat, reads are bounded by
// them) and an atomic writer (temp file in the target's directory, fsync, rename; the temp file
// is removed on any failure, so a reader never sees a partial output). commit_all() puts several
// outputs in place all or nothing: either every target holds its new file, or every target is
// as it was (an old file restored from a hard link taken before the first rename).
//
// Temporary and backup names are ".<name>.tmp-<16 hex>" and ".<name>.bak-<16 hex>" in the
// target's directory, with <name> shortened (and a hash of it added) when that would exceed
// NAME_MAX, so any legal output name works.
//
// Testing hook: DETLOGP_TESTING_IO_FAIL=<step>:<file name> makes the given step fail for the
// output whose file name (last path component) is <file name>: "write" fails as a full disk
// (ENOSPC), "rename" as an I/O error (EIO) when that output is renamed into place, "link" as a
// refused hard link (EPERM, as under protected hardlinks) when its backup is taken. Tests use it
// to check that a failure between two renames leaves the old files as they were, and that no
// backup outlives a commit.
//
// Errors: a missing file or directory, or a path that is not a regular file, is an input problem
// (ContractError); anything else the system refuses (permissions, disk full, I/O errors) is an
// environment failure (std::runtime_error). Messages start with the path.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

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
  const std::filesystem::path& path() const { return path_; }
  void write(std::span<const std::byte> bytes);
  // fsync, close, rename over the target, fsync the directory.
  void commit();

 private:
  friend void commit_all(std::span<AtomicOutputFile* const> files);
  void discard() noexcept;
  // fsync and close the temp file (the first half of commit).
  void finish();
  // Renames the finished temp file over the target (the second half).
  void rename_into_place();

  std::filesystem::path path_;
  std::filesystem::path temp_path_;
  std::string label_;
  int fd_ = -1;
  bool finished_ = false;
  bool committed_ = false;
};

// Commits every file (each written in full), all or nothing. Each one is fsynced and closed
// first; then each existing target gets a hard link backup (renamed aside when the file system
// has no hard links); then the temp files are renamed into place. If a rename fails, the
// targets already replaced get their old files back (a target that did not exist is removed
// again), the temp files are removed, and the error names the path that failed. The backups
// (links, or old files renamed aside) are removed once every file is in place.
void commit_all(std::span<AtomicOutputFile* const> files);

// "<dir>/.<name><suffix><16 hex>" for `target`, within NAME_MAX whatever the length of <name>.
std::filesystem::path sibling_name(const std::filesystem::path& target, std::string_view suffix);

}  // namespace detlogp::io
