#include "synthetic.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "detlogp/dtype.hpp"
#include "numerics/mix64.hpp"
#include "parallel.hpp"

namespace detlogp::cli {
namespace {

constexpr double kBackgroundSigma = 2.0;
constexpr int kMaxLarge = 8;
constexpr float kPaddingGarbage = 30000.0f;

using numerics::mix64;

uint64_t splitmix64(uint64_t x) { return mix64(x + 0x9e3779b97f4a7c15ULL); }

// A 64-bit hash of (key, stream, a, b); streams keep the uses apart.
uint64_t hash(uint64_t key, uint64_t stream, uint64_t a, uint64_t b) {
  uint64_t h = mix64(key + 0x9e3779b97f4a7c15ULL * (stream + 1));
  h = mix64(h ^ (a * 0xd6e8feb86659fd93ULL));
  return mix64(h ^ (b + 0x632be59bd9b4e019ULL));
}

double unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }  // [0, 1)

enum Stream : uint64_t { kBackgroundA, kBackgroundB, kLarge, kTarget, kGrads };

float background(uint64_t key, int64_t row, int64_t col) {
  const uint64_t a =
      hash(key, kBackgroundA, static_cast<uint64_t>(row), static_cast<uint64_t>(col));
  const uint64_t b =
      hash(key, kBackgroundB, static_cast<uint64_t>(row), static_cast<uint64_t>(col));
  constexpr uint64_t kMask = (uint64_t{1} << 21) - 1;
  const uint64_t sum = (a & kMask) + ((a >> 21) & kMask) + ((a >> 42) & kMask) + (b & kMask) +
                       ((b >> 21) & kMask) + ((b >> 42) & kMask);
  // Six uniforms on [0, 2^21): mean 3 (2^21 - 1), variance 6 (2^42 - 1) / 12.
  const double mean = 3.0 * static_cast<double>(kMask);
  const double sd = std::sqrt(0.5 * (0x1.0p42 - 1.0));  // sqrt is correctly rounded (IEEE)
  return static_cast<float>((static_cast<double>(sum) - mean) / sd * kBackgroundSigma);
}

struct Large {
  int count = 0;
  std::array<int64_t, kMaxLarge> col{};
  std::array<float, kMaxLarge> value{};
};

Large large_logits(const SyntheticSpec& s, int64_t row) {
  Large l;
  const uint64_t r = static_cast<uint64_t>(row);
  l.count = 3 + static_cast<int>(hash(s.key, kLarge, r, 0) % 6);
  for (int k = 0; k < l.count; ++k) {
    const uint64_t h = hash(s.key, kLarge, r, static_cast<uint64_t>(k) + 1);
    l.col[k] = static_cast<int64_t>(h % static_cast<uint64_t>(s.real_vocab));
    l.value[k] = static_cast<float>(8.0 + 12.0 * unit(mix64(h)));
  }
  return l;
}

float padding_value(int64_t col) { return (col % 2 == 0) ? kPaddingGarbage : -kPaddingGarbage; }

float round_trip(DType dtype, float v) {
  return dtype == DType::fp32 ? v : widen_half(dtype, narrow_half(dtype, v));
}

}  // namespace

void store(DType dtype, float v, std::byte* out) {
  if (dtype == DType::fp32) {
    std::memcpy(out, &v, 4);
    return;
  }
  const uint16_t h = narrow_half(dtype, v);
  std::memcpy(out, &h, 2);
}

float synthetic_logit(const SyntheticSpec& spec, int64_t row, int64_t col) {
  if (col >= spec.real_vocab) return padding_value(col);
  const Large l = large_logits(spec, row);
  float v = background(spec.key, row, col);
  for (int k = 0; k < l.count; ++k) {
    if (l.col[k] == col) v = l.value[k];  // the last one wins, as in fill_logits
  }
  return v;
}

float synthetic_stored_logit(const SyntheticSpec& spec, int64_t row, int64_t col) {
  return round_trip(spec.dtype, synthetic_logit(spec, row, col));
}

void fill_logits(const SyntheticSpec& spec, int64_t row_begin, int64_t row_end, int64_t col_begin,
                 int64_t col_end, void* out, int64_t row_stride, int threads) {
  const std::size_t esz = dtype_size(spec.dtype);
  auto* base = static_cast<std::byte*>(out);
  parallel_for(row_end - row_begin, threads, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) {
      const int64_t row = row_begin + i;
      std::byte* dst = base + static_cast<std::size_t>(i * row_stride) * esz;
      for (int64_t c = col_begin; c < col_end; ++c) {
        const float v = c < spec.real_vocab ? background(spec.key, row, c) : padding_value(c);
        store(spec.dtype, v, dst + static_cast<std::size_t>(c - col_begin) * esz);
      }
      const Large l = large_logits(spec, row);
      for (int k = 0; k < l.count; ++k) {
        if (l.col[k] >= col_begin && l.col[k] < col_end) {
          store(spec.dtype, l.value[k], dst + static_cast<std::size_t>(l.col[k] - col_begin) * esz);
        }
      }
    }
  });
}

std::vector<uint8_t> dense_matrix(DType dtype, int64_t rows, int64_t cols, uint64_t salt,
                                  double scale, int threads) {
  const std::size_t esz = dtype_size(dtype);
  std::vector<uint8_t> out(static_cast<std::size_t>(rows * cols) * esz);
  parallel_for(rows, threads, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const auto i = static_cast<uint64_t>(r * cols + c);
        const uint64_t h = splitmix64(salt ^ splitmix64(i));
        const double u = static_cast<double>(h & 0x1fffff) +
                         static_cast<double>((h >> 21) & 0x1fffff) +
                         static_cast<double>((h >> 42) & 0x1fffff);
        const auto v = static_cast<float>((u / 2097152.0 - 1.5) * 2.0 * scale);
        store(dtype, v,
              reinterpret_cast<std::byte*>(out.data()) + static_cast<std::size_t>(i) * esz);
      }
    }
  });
  return out;
}

SyntheticRows synthetic_rows(const SyntheticSpec& spec, int64_t row_begin, int64_t row_end) {
  SyntheticRows rows;
  const int64_t seq = std::min(kMaxSequenceLength, spec.tokens);
  const int64_t prompt = seq / 10;
  // The background's expected softmax mass: R E[exp(z)] = R exp(sigma^2 / 2).
  const double background_mass =
      static_cast<double>(spec.real_vocab) * std::exp(kBackgroundSigma * kBackgroundSigma / 2);
  const auto real = static_cast<uint64_t>(spec.real_vocab);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const auto r = static_cast<uint64_t>(row);
    const bool active = row % seq >= prompt;
    int64_t target = kIgnoreIndex;
    if (active) {
      const uint64_t h = hash(spec.key, kTarget, r, 0);
      const uint64_t pick = hash(spec.key, kTarget, r, 1);
      target = static_cast<int64_t>(pick % real);  // uniform (and the background bucket)
      if (h % 4 != 0) {
        const Large l = large_logits(spec, row);
        std::array<double, kMaxLarge> w{};
        double total = background_mass;
        for (int k = 0; k < l.count; ++k) {
          w[k] = std::exp(static_cast<double>(round_trip(spec.dtype, l.value[k])));
          total += w[k];
        }
        double u = unit(hash(spec.key, kTarget, r, 2)) * total;
        for (int k = 0; k < l.count; ++k) {
          if (u < w[k]) {
            target = l.col[k];
            break;
          }
          u -= w[k];
        }
      }
    }
    const uint64_t g = hash(spec.key, kGrads, r, 0);
    rows.targets.push_back(target);
    rows.active.push_back(active);
    rows.grad_logp.push_back(static_cast<float>(static_cast<int64_t>(g % 2049) - 1024) / 1024.0f);
    rows.grad_lse.push_back(static_cast<float>(static_cast<int64_t>((g >> 16) % 513) - 256) /
                            1024.0f);
    rows.grad_entropy.push_back(static_cast<float>(static_cast<int64_t>((g >> 32) % 257) - 128) /
                                1024.0f);
  }
  return rows;
}

}  // namespace detlogp::cli
