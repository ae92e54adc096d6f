// Uses the installed headers and library: computes one row's LSE through the public API.
#include <cmath>
#include <cstdio>
#include <vector>

#include <detlogp/detlogp.hpp>

int main() {
  std::vector<float> row = {1.0f, 2.0f, 3.0f, 0.5f};
  detlogp::LogitsView logits{
      .data = row.data(), .dtype = detlogp::DType::fp32, .rows = 1, .cols = 4, .row_stride = 4};
  detlogp::ShardSpec shard{.vocab_start = 0, .geometry = {.real_vocab = 4, .tile_width = 4}};
  auto cover = detlogp::canonical_cover(shard.geometry, 0, shard.geometry.num_real_tiles());
  std::vector<detlogp::NodePartial> partials(cover.size());
  detlogp::reference_kernels().node_partials(logits, shard, cover, false, partials);
  std::vector<float> lse(1);
  detlogp::reference_kernels().merge_roots(shard.geometry, cover, partials, 1, {.lse = lse});
  const double expected = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(0.5));
  std::printf("detlogp %s: lse %.7f (expected %.7f)\n", std::string(detlogp::version()).c_str(),
              lse[0], expected);
  return std::fabs(lse[0] - expected) < 1e-5 ? 0 : 1;
}
