// A C++ user's MPI program against the installed package (mpirun -np 2): each rank holds one
// vocabulary shard of a TP=2 group over MPI; logp, LSE and entropy must be bitwise equal to
// TP=1 computed by this process alone on the full logits.
#include <cstdio>
#include <cstring>
#include <vector>

#include <detlogp/detlogp.hpp>
#include <detlogp/mpi_comm.hpp>

#include "problem.hpp"

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  using consumer::kReal;
  using consumer::kRows;
  detlogp::MpiSession session(&argc, &argv);
  detlogp::MpiComm world = detlogp::MpiComm::world();
  const int64_t tp = world.size();

  // Layout for TP=tp; TP=1 uses the same padded width (and so the same logits).
  const detlogp::VocabLayout layout = detlogp::megatron_bounds(kReal, tp);
  const int64_t padded = layout.padded_vocab_size;
  const detlogp::VocabLayout whole{.padded_vocab_size = padded,
                                   .vocab_shard_bounds = {{0, padded}}};
  const std::vector<float> z = consumer::logits(padded);
  const std::vector<int64_t> t = consumer::targets();

  const detlogp::LogprobContract c1 = consumer::contract(whole, 0);
  detlogp::SelfComm self;
  const detlogp::LogprobResult ref =
      detlogp::get_logprob_op(c1).op->forward({.data = z.data(),
                                               .dtype = detlogp::DType::fp32,
                                               .rows = kRows,
                                               .cols = padded,
                                               .row_stride = padded},
                                              t, c1, self, {.entropy = true});

  const detlogp::VocabRange mine =
      layout.vocab_shard_bounds[static_cast<std::size_t>(world.rank())];
  const detlogp::LogprobContract c = consumer::contract(layout, world.rank());
  const detlogp::LogprobResult out =
      detlogp::get_logprob_op(c).op->forward({.data = z.data() + mine.start,
                                              .dtype = detlogp::DType::fp32,
                                              .rows = kRows,
                                              .cols = mine.size(),
                                              .row_stride = padded},
                                             t, c, world, {.entropy = true});

  const bool ok = same_bits(out.logp, ref.logp) && same_bits(out.lse, ref.lse) &&
                  same_bits(out.entropy, ref.entropy);
  std::printf("rank %d of %lld (MPI, shard [%lld, %lld)): TP=%lld %s TP=1 bitwise\n", world.rank(),
              static_cast<long long>(tp), static_cast<long long>(mine.start),
              static_cast<long long>(mine.end), static_cast<long long>(tp),
              ok ? "equals" : "DIFFERS FROM");
  return ok && tp > 1 ? 0 : 1;
}
