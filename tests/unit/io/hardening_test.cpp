// The io layer under stress: outputs put in place all or nothing (a failure between two renames
// leaves the old files byte-identical), temp names within NAME_MAX for any legal output name,
// headers with very many tensors parsed in linear time, the tensor-count cap, and up-front
// memory refusals of files that claim more than this process can hold.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/file.hpp"
#include "io/npy.hpp"
#include "io/safetensors.hpp"
#include "io/tensor_file.hpp"
#include "io_test_util.hpp"
#include "memory/memory.hpp"

namespace detlogp::io {
namespace {

using testing::read_file;
using testing::ScratchDir;
using testing::write_file;

// Sets an environment variable for the scope of one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

void write_whole(AtomicOutputFile& out, std::string_view text) {
  out.write(std::as_bytes(std::span(text.data(), text.size())));
}

// Writes `a_text` to a and `b_text` to b together.
void commit_pair(const std::filesystem::path& a, std::string_view a_text,
                 const std::filesystem::path& b, std::string_view b_text) {
  AtomicOutputFile fa(a);
  AtomicOutputFile fb(b);
  write_whole(fa, a_text);
  write_whole(fb, b_text);
  AtomicOutputFile* both[] = {&fa, &fb};
  commit_all(both);
}

// What the commit tests write: new tensors to out.safetensors, new provenance to out.json.
void commit_new_pair(const ScratchDir& dir) {
  commit_pair(dir / "out.safetensors", "new tensors", dir / "out.json", "new provenance");
}

// The old pair a commit test starts from.
void write_old_pair(const ScratchDir& dir, const std::string& tensors = "old tensors") {
  write_file(dir / "out.safetensors", tensors);
  write_file(dir / "out.json", "old provenance");
}

// Both files hold the given text (byte for byte) and nothing else is left, no temporary file.
void expect_pair(const ScratchDir& dir, const std::string& tensors, const std::string& provenance) {
  EXPECT_EQ(read_file(dir / "out.safetensors"), tensors);
  EXPECT_EQ(read_file(dir / "out.json"), provenance);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"out.json", "out.safetensors"}));
}

// The message of the std::runtime_error that a failing commit_new_pair throws.
std::string commit_error(const ScratchDir& dir) {
  try {
    commit_new_pair(dir);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

// After a failed commit where only out.json existed: it is unchanged and alone.
void expect_only_old_provenance(const ScratchDir& dir) {
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"out.json"}));
  EXPECT_EQ(read_file(dir / "out.json"), "old provenance");
}

TEST(CommitAll, BothNewFilesOnSuccessAndNoLeftovers) {
  ScratchDir dir;
  write_old_pair(dir);
  commit_new_pair(dir);
  expect_pair(dir, "new tensors", "new provenance");
}

TEST(CommitAll, RenameFailureAfterTheFirstRenameRestoresTheOldFiles) {
  ScratchDir dir;
  const std::string old_out = std::string("old tensors \0 with a NUL", 24);
  write_old_pair(dir, old_out);
  const ScopedEnv hook("DETLOGP_TESTING_IO_FAIL", "rename:out.json");
  const std::string what = commit_error(dir);
  EXPECT_NE(what.find((dir / "out.json").string()), std::string::npos) << what;
  EXPECT_NE(what.find("cannot rename the temporary file into place"), std::string::npos) << what;
  EXPECT_NE(what.find("left as before: " + (dir / "out.safetensors").string()), std::string::npos)
      << what;
  expect_pair(dir, old_out, "old provenance");  // byte-identical
}

// Where link() is refused (protected hardlinks, no hard links), the old file is renamed aside
// instead; a successful commit removes it like a link, a failed one puts it back.
TEST(CommitAll, OldFilesRenamedAsideWhereLinkIsRefusedAreRemovedAfterACommit) {
  ScratchDir dir;
  write_old_pair(dir);
  const ScopedEnv hook("DETLOGP_TESTING_IO_FAIL", "link:out.json");
  commit_new_pair(dir);
  expect_pair(dir, "new tensors", "new provenance");
}

TEST(CommitAll, ANewFirstFileIsRemovedAgainWhenTheSecondFails) {
  ScratchDir dir;
  write_file(dir / "out.json", "old provenance");
  const ScopedEnv hook("DETLOGP_TESTING_IO_FAIL", "rename:out.json");
  EXPECT_THROW(commit_new_pair(dir), std::runtime_error);
  expect_only_old_provenance(dir);
}

TEST(CommitAll, DiskFullWhileWritingNamesThePathAndKeepsTheOldFile) {
  ScratchDir dir;
  write_file(dir / "out.json", "old provenance");
  const ScopedEnv hook("DETLOGP_TESTING_IO_FAIL", "write:out.json");
  const std::string what = commit_error(dir);
  EXPECT_EQ(what.rfind((dir / "out.json").string() + ": disk full while writing", 0), 0u) << what;
  expect_only_old_provenance(dir);
}

TEST(CommitAll, ReadOnlyDirectoryFailsBeforeAnythingChanges) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  ScratchDir dir;
  std::filesystem::create_directory(dir / "ro");
  write_file(dir / "out.safetensors", "old tensors");
  std::filesystem::permissions(
      dir / "ro", std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  EXPECT_THROW(commit_pair(dir / "out.safetensors", "new", dir / "ro" / "p.json", "new"),
               std::runtime_error);
  std::filesystem::permissions(dir / "ro", std::filesystem::perms::owner_all);
  EXPECT_EQ(read_file(dir / "out.safetensors"), "old tensors");
}

TEST(TempNames, FitNameMaxForAnyLegalOutputName) {
  ScratchDir dir;
  for (const std::size_t length : {std::size_t{200}, std::size_t{250}, std::size_t{NAME_MAX}}) {
    const std::string name = std::string(length - 12, 'n') + ".safetensors";
    ASSERT_EQ(name.size(), length);
    const std::filesystem::path temp = sibling_name(dir / name, ".tmp-");
    EXPECT_LE(temp.filename().string().size(), static_cast<std::size_t>(NAME_MAX)) << length;
    const std::vector<float> values = {1.0f, 2.0f};
    const std::vector<std::int64_t> shape = {2};
    const TensorRef t{"logp", TensorDType::F32, shape, std::as_bytes(std::span(values))};
    write_tensors(dir / name, std::span(&t, 1));
    EXPECT_EQ(read_tensor(dir / name).data.size(), 8u) << length;
    std::filesystem::remove(dir / name);
  }
  // Two long names that share their first 230 bytes get different temp-name stems.
  const std::string a = std::string(240, 'x') + "a.npy";
  const std::string b = std::string(240, 'x') + "b.npy";
  const std::string ta = sibling_name(dir / a, ".tmp-").filename().string();
  const std::string tb = sibling_name(dir / b, ".tmp-").filename().string();
  EXPECT_NE(ta.substr(0, ta.size() - 16), tb.substr(0, tb.size() - 16));
}

std::string many_tensors_header(std::size_t n) {
  std::string s = "{";
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) s += ',';
    s += "\"t" + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})";
  }
  return s + "}";
}

TEST(SafetensorsHeader, HundredThousandTensorsParseInLinearTime) {
  const std::string header = many_tensors_header(100'000);
  const auto t0 = std::chrono::steady_clock::now();
  const SafetensorsHeader parsed =
      parse_safetensors_header(std::as_bytes(std::span(header)), 0, "many.safetensors");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("parsed a header of 100000 tensors (%zu bytes) in %.3f s\n", header.size(), seconds);
  EXPECT_EQ(parsed.entries.size(), 100'000u);
#if defined(__SANITIZE_ADDRESS__)
  constexpr double kBound = 60.0;  // the sanitizers slow everything several times
#else
  constexpr double kBound = 10.0;  // generous: under a second here; quadratic parsing took minutes
#endif
  EXPECT_LT(seconds, kBound);
}

TEST(SafetensorsHeader, TensorCountAboveTheCapIsRefused) {
  const std::string header = many_tensors_header(kMaxSafetensorsTensors + 1);
  testing::expect_contract_error(
      [&] { parse_safetensors_header(std::as_bytes(std::span(header)), 0, "cap.safetensors"); },
      "cap.safetensors", "more than " + std::to_string(kMaxSafetensorsTensors) + " tensors");
}

TEST(SafetensorsHeader, DeepNestingAndRepeatedKeysStillRefused) {
  std::string deep(1'000'000, '[');
  testing::expect_contract_error(
      [&] { parse_safetensors_header(std::as_bytes(std::span(deep)), 0, "deep.safetensors"); },
      "deep.safetensors", "nests deeper than 8 levels");
  const std::string repeated = R"({"a":{"dtype":"F32","dtype":"F32"}})";
  testing::expect_contract_error(
      [&] { parse_safetensors_header(std::as_bytes(std::span(repeated)), 0, "dup.safetensors"); },
      "dup.safetensors", "repeats the key 'dtype'");
}

// An .npy header declaring `elements` float32 values, the file extended (sparse) to match.
std::optional<std::filesystem::path> sparse_npy(const ScratchDir& dir, std::int64_t elements) {
  // The header of a real (tiny) file, with the shape patched in textually.
  const std::vector<float> one = {0.0f};
  const std::vector<std::int64_t> one_shape = {1};
  const TensorRef tiny{"x", TensorDType::F32, one_shape, std::as_bytes(std::span(one))};
  std::vector<std::byte> bytes = serialize_npy(tiny, "tiny");
  std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size() - 4);
  const auto pos = text.find("(1,)");
  const std::string replaced = "(" + std::to_string(elements) + ",)";
  text.replace(pos, 4, replaced);
  text.erase(text.find('\n') - (replaced.size() - 4), replaced.size() - 4);  // keep the length
  const auto path = dir / "sparse.npy";
  write_file(path, text);
  const int fd = ::open(path.c_str(), O_WRONLY);
  const bool ok = fd >= 0 && ::ftruncate(fd, static_cast<off_t>(text.size()) +
                                                 static_cast<off_t>(elements) * 4) == 0;
  if (fd >= 0) ::close(fd);
  if (!ok) return std::nullopt;
  return path;
}

TEST(MemoryCheck, SparseFileClaimingMoreThanTheLimitIsRefusedUpFront) {
  ScratchDir dir;
  const auto path = sparse_npy(dir, 1'000'000);  // 4 MB of zeros
  ASSERT_TRUE(path);
  EXPECT_EQ(read_npy(*path).data.size(), 4'000'000u);  // fits without a limit
  const ScopedEnv hook("DETLOGP_TESTING_MEMORY_LIMIT", "1000000");
  try {
    read_tensor(*path);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(path->string() + ": reading its F32 array", 0), 0u) << what;
    EXPECT_NE(what.find("needs 4000000 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("has 1000000 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("DETLOGP_TESTING_MEMORY_LIMIT"), std::string::npos) << what;
    EXPECT_NE(what.find("smaller file"), std::string::npos) << what;
  }
}

TEST(MemoryCheck, TerabyteSparseFileIsRefusedWithoutAHook) {
  ScratchDir dir;
  const auto path = sparse_npy(dir, 250'000'000'000);  // 1 TB claimed
  if (!path) GTEST_SKIP() << "the file system refuses a 1 TB sparse file";
  const AvailableMemory available = available_memory();
  ASSERT_TRUE(available.known);
  ASSERT_LT(available.bytes, 1'000'000'000'000u);
  try {
    read_tensor(*path);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("needs 1000000000000 bytes (1000.0 GB)"), std::string::npos) << what;
    EXPECT_EQ(what.find("bad_alloc"), std::string::npos) << what;
  }
}

TEST(MemoryCheck, AvailableMemoryComesFromTheCgroupOrMeminfo) {
  const AvailableMemory available = available_memory();
  ASSERT_TRUE(available.known);
  EXPECT_GT(available.bytes, 0u);
  EXPECT_TRUE(available.source.starts_with("cgroup") ||
              available.source.starts_with("MemAvailable"))
      << available.source;
}

TEST(MemoryCheck, CheckedProductRefusesOverflow) {
  EXPECT_EQ(checked_product({3, 5, 7}, "x"), 105u);
  try {
    checked_product({std::uint64_t{1} << 40, std::uint64_t{1} << 30, 2}, "the logits");
    FAIL() << "no error";
  } catch (const ContractError& e) {
    EXPECT_NE(std::string(e.what()).find("the logits overflows 64-bit sizes"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace detlogp::io
