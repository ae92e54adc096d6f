#include "io/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

#include "io/detail.hpp"

namespace detlogp::io {
namespace {

[[noreturn]] void environment_failure(const std::string& label, std::string_view what, int err) {
  throw std::runtime_error(
      detail::printable(fmt::format("{}: {}: {}", label, what, std::strerror(err)), 2000));
}

std::string random_suffix() {
  thread_local std::mt19937_64 engine{[] {
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) ^ device() ^
           static_cast<std::uint64_t>(::getpid());
  }()};
  return fmt::format("{:016x}", engine());
}

}  // namespace

InputFile::InputFile(const std::filesystem::path& path) : label_(path.string()) {
  do {
    // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) detail::fail(label_, "file not found");
    if (label_.empty()) detail::fail(label_, "empty file name");
    environment_failure(label_, "cannot open", err);
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    environment_failure(label_, "cannot stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    detail::fail(label_, S_ISDIR(st.st_mode) ? "is a directory, not a tensor file"
                                             : "is not a regular file");
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(std::uint64_t offset, std::span<std::byte> out) const {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t got =
        ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      environment_failure(label_, "read error", errno);
    }
    if (got == 0) {
      detail::fail(label_, fmt::format("file ended at byte {} while reading {} bytes at offset {} "
                                       "(was it changed while being read?)",
                                       offset + done, out.size(), offset));
    }
    done += static_cast<std::size_t>(got);
  }
}

AtomicOutputFile::AtomicOutputFile(const std::filesystem::path& path)
    : path_(path), label_(path.string()) {
  if (label_.empty()) detail::fail(label_, "empty output file name");
  if (!path.has_filename()) detail::fail(label_, "output path names a directory, not a file");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    detail::fail(label_, "output path is an existing directory");
  }
  std::filesystem::path dir = path.parent_path();
  if (dir.empty()) dir = ".";
  std::string base(1, '.');
  base += path.filename().string();
  base += ".tmp-";
  for (int attempt = 0; attempt < 100; ++attempt) {
    temp_path_ = dir / (base + random_suffix());
    do {
      fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    } while (fd_ < 0 && errno == EINTR);
    if (fd_ >= 0) return;
    const int err = errno;
    if (err == EEXIST) continue;
    if (err == ENOENT || err == ENOTDIR) {
      detail::fail(label_, fmt::format("cannot create the output file: directory {} does not exist",
                                       detail::in_quotes(dir.string())));
    }
    environment_failure(
        label_,
        fmt::format("cannot create a temporary file in {}", detail::in_quotes(dir.string())), err);
  }
  throw std::runtime_error(label_ + ": cannot find a free temporary file name");
}

AtomicOutputFile::~AtomicOutputFile() { discard(); }

void AtomicOutputFile::discard() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!committed_ && !temp_path_.empty()) {
    ::unlink(temp_path_.c_str());
    temp_path_.clear();
  }
}

void AtomicOutputFile::write(std::span<const std::byte> bytes) {
  if (fd_ < 0) throw std::logic_error(label_ + ": write after commit or failure");
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t put = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (put < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      discard();
      environment_failure(label_, err == ENOSPC ? "disk full while writing" : "write error", err);
    }
    done += static_cast<std::size_t>(put);
  }
}

void AtomicOutputFile::commit() {
  if (fd_ < 0) throw std::logic_error(label_ + ": commit after commit or failure");
  if (::fsync(fd_) != 0) {
    const int err = errno;
    discard();
    environment_failure(label_, "fsync failed", err);
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    discard();
    environment_failure(label_, "close failed", err);
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    discard();
    if (err == EISDIR) detail::fail(label_, "output path is an existing directory");
    environment_failure(label_, "cannot rename the temporary file into place", err);
  }
  committed_ = true;
  // Make the rename durable; some file systems refuse fsync on a directory, which is harmless.
  std::filesystem::path dir = path_.parent_path();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    (void)::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace detlogp::io
