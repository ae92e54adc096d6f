#pragma once
// SHA-256 digests of raw bytes (OpenSSL EVP), fed in pieces: the run command hashes outputs
// and gradient rows without joining them first.

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace detlogp::cli {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(std::span<const std::byte> bytes);
  // Lowercase hex (64 characters). Call once.
  std::string hex();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

std::string sha256_hex(std::span<const std::byte> bytes);

template <class T>
std::string sha256_hex_of(const std::vector<T>& values) {
  return sha256_hex(std::as_bytes(std::span<const T>(values)));
}

}  // namespace detlogp::cli
