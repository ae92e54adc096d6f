#include "io/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

#include "detlogp/errors.hpp"
#include "io/detail.hpp"

namespace detlogp::io {
namespace {

[[noreturn]] void environment_failure(const std::string& label, std::string_view what, int err) {
  throw std::runtime_error(
      detail::printable(fmt::format("{}: {}: {}", label, what, std::strerror(err)), 2000));
}

// The testing hook of file.hpp: whether DETLOGP_TESTING_IO_FAIL names this step and file.
bool injected_failure(std::string_view step, const std::filesystem::path& target) {
  const char* spec = std::getenv("DETLOGP_TESTING_IO_FAIL");
  if (spec == nullptr) return false;
  const std::string_view text(spec);
  const auto colon = text.find(':');
  return colon != text.npos && text.substr(0, colon) == step &&
         text.substr(colon + 1) == target.filename().string();
}

std::uint64_t fnv1a(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::filesystem::path directory_of(const std::filesystem::path& target) {
  std::filesystem::path dir = target.parent_path();
  return dir.empty() ? std::filesystem::path(".") : dir;
}

void fsync_directory(const std::filesystem::path& dir) {
  // Makes renames durable; some file systems refuse fsync on a directory, which is harmless.
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    (void)::fsync(dir_fd);
    ::close(dir_fd);
  }
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
  const std::filesystem::path dir = directory_of(path);
  for (int attempt = 0; attempt < 100; ++attempt) {
    temp_path_ = sibling_name(path, ".tmp-");
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
    const bool injected = injected_failure("write", path_);
    if (put < 0 || injected) {
      const int err = injected ? ENOSPC : errno;
      if (err == EINTR) continue;
      discard();
      environment_failure(label_, err == ENOSPC ? "disk full while writing" : "write error", err);
    }
    done += static_cast<std::size_t>(put);
  }
}

void AtomicOutputFile::finish() {
  if (fd_ < 0 || finished_) throw std::logic_error(label_ + ": commit after commit or failure");
  if (::fsync(fd_) != 0) {
    const int err = errno;
    discard();
    environment_failure(label_, err == ENOSPC ? "disk full while writing (fsync)" : "fsync failed",
                        err);
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    discard();
    environment_failure(label_, err == ENOSPC ? "disk full while writing (close)" : "close failed",
                        err);
  }
  finished_ = true;
}

void AtomicOutputFile::rename_into_place() {
  const bool injected = injected_failure("rename", path_);
  if (injected || ::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int err = injected ? EIO : errno;
    discard();
    if (err == EISDIR) detail::fail(label_, "output path is an existing directory");
    environment_failure(label_, "cannot rename the temporary file into place", err);
  }
  committed_ = true;
}

void AtomicOutputFile::commit() {
  finish();
  rename_into_place();
  fsync_directory(directory_of(path_));
}

std::filesystem::path sibling_name(const std::filesystem::path& target, std::string_view suffix) {
  std::string name = target.filename().string();
  constexpr std::size_t kRandomChars = 16;
  const std::size_t room = NAME_MAX - 1 - suffix.size() - kRandomChars;  // 1: the leading dot
  if (name.size() > room) {
    // Shortened; the hash of the whole name keeps two long names that share a prefix apart.
    const std::string hash = fmt::format("~{:08x}", fnv1a(name) & 0xffffffffULL);
    name = name.substr(0, room - hash.size()) + hash;
  }
  return directory_of(target) / fmt::format(".{}{}{}", name, suffix, random_suffix());
}

void commit_all(std::span<AtomicOutputFile* const> files) {
  for (AtomicOutputFile* file : files) file->finish();
  // Before any rename: a hard link to every existing target, so that each can be put back.
  // Where the file system has no hard links, the target is renamed aside just before its
  // replacement instead (it is then briefly absent).
  struct Backup {
    std::filesystem::path path;  // empty: the target did not exist
    bool linked = false;         // false: rename the target aside before replacing it
  };
  std::vector<Backup> backups(files.size());
  auto remove_links = [&] {
    for (const Backup& b : backups) {
      if (b.linked && !b.path.empty()) ::unlink(b.path.c_str());
    }
  };
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::filesystem::path& target = files[i]->path_;
    struct stat st {};
    if (::lstat(target.c_str(), &st) != 0) continue;  // nothing to keep
    Backup& b = backups[i];
    for (int attempt = 0; attempt < 100 && !b.linked; ++attempt) {
      b.path = sibling_name(target, ".bak-");
      const bool refused = injected_failure("link", target);
      if (!refused && ::link(target.c_str(), b.path.c_str()) == 0) {
        b.linked = true;
        break;
      }
      const int err = refused ? EPERM : errno;
      if (err == EEXIST) continue;
      if (err == EPERM || err == EXDEV || err == EMLINK || err == ENOTSUP || err == EOPNOTSUPP) {
        break;  // no hard links here: rename aside later
      }
      b.path.clear();
      remove_links();
      environment_failure(files[i]->label_,
                          err == ENOSPC ? "disk full while keeping a backup of the existing file"
                                        : "cannot keep a backup of the existing file",
                          err);
    }
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    AtomicOutputFile& file = *files[i];
    Backup& b = backups[i];
    try {
      if (!b.path.empty() && !b.linked && ::rename(file.path_.c_str(), b.path.c_str()) != 0) {
        const int err = errno;
        b.path.clear();
        environment_failure(file.label_, "cannot move the existing file aside", err);
      }
      file.rename_into_place();
    } catch (const std::exception& error) {
      // Put back what was replaced, newest first; whatever cannot be restored is named.
      std::string restored, lost;
      for (std::size_t j = i + 1; j-- > 0;) {
        const std::filesystem::path& target = files[j]->path_;
        const Backup& back = backups[j];
        const bool replaced = j < i;
        bool ok = true;
        if (!back.path.empty() && (replaced || !back.linked)) {
          ok = ::rename(back.path.c_str(), target.c_str()) == 0;
        } else if (back.path.empty() && replaced) {
          ok = ::unlink(target.c_str()) == 0;
        } else if (!replaced) {
          continue;  // untouched
        }
        std::string& list = ok ? restored : lost;
        list += (list.empty() ? "" : ", ") + target.string();
        if (!ok && !back.path.empty()) list += " (the old file is at " + back.path.string() + ")";
      }
      for (std::size_t j = 0; j < files.size(); ++j) {
        const Backup& back = backups[j];
        if (back.linked && !back.path.empty()) ::unlink(back.path.c_str());
      }
      std::string message = error.what();
      if (!restored.empty()) message += "; left as before: " + restored;
      if (!lost.empty()) message += "; could not restore: " + lost;
      if (dynamic_cast<const ContractError*>(&error) != nullptr) throw ContractError(message);
      throw std::runtime_error(detail::printable(message, 4000));
    }
  }
  for (AtomicOutputFile* file : files) fsync_directory(directory_of(file->path_));
  // Every backup goes, a link or an old file renamed aside (where link() was refused): every
  // target now holds its new file.
  for (const Backup& b : backups) {
    if (!b.path.empty()) ::unlink(b.path.c_str());
  }
}

}  // namespace detlogp::io
