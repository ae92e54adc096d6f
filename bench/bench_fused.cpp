// The fused lm_head benchmark (docs/benchmarks.md, "The fused lm_head"): in one run, this
// machine's fp32 FMA peak (fma_peak.cpp), the canonical dot-product throughput of linear_logits
// and of the fused forward against it, and the fused forward + backward time on one rank's
// shape (hidden [tokens, H], weight [local_vocab, H]). Peak resident memory at the end
// (ru_maxrss) covers the whole process: run it once per token count to see what grows.
// One JSON object on stdout.
//
//   bench_fused --tokens 512 --hidden 4096 --vocab 37984 --threads 2 --dtype fp32
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "detlogp/comm.hpp"
#include "detlogp/fused.hpp"
#include "detlogp/fused_dispatch.hpp"
#include "fma_peak.hpp"
#include "numerics/canon.hpp"

namespace {

using namespace detlogp;

struct Args {
  int64_t tokens = 512, hidden = 4096, vocab = 37984;
  int threads = 2, reps = 1;
  int64_t row_block = 32;
  std::string dtype = "fp32";
  bool skip_peak = false;
};

// The options that take a value, each with where its value goes.
using SetOption = void (*)(Args&, const std::string&);
const std::pair<std::string_view, SetOption> kValueOptions[] = {
    {"--tokens", [](Args& a, const std::string& v) { a.tokens = std::stoll(v); }},
    {"--hidden", [](Args& a, const std::string& v) { a.hidden = std::stoll(v); }},
    {"--vocab", [](Args& a, const std::string& v) { a.vocab = std::stoll(v); }},
    {"--threads", [](Args& a, const std::string& v) { a.threads = std::stoi(v); }},
    {"--reps", [](Args& a, const std::string& v) { a.reps = std::stoi(v); }},
    {"--row-block", [](Args& a, const std::string& v) { a.row_block = std::stoll(v); }},
    {"--dtype", [](Args& a, const std::string& v) { a.dtype = v; }},
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--skip-peak") {
      a.skip_peak = true;
      continue;
    }
    const auto* option = std::find_if(std::begin(kValueOptions), std::end(kValueOptions),
                                      [&](const auto& o) { return o.first == k; });
    if (option == std::end(kValueOptions)) {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      std::exit(2);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", k.c_str());
      std::exit(2);
    }
    option->second(a, argv[++i]);
  }
  return a;
}

std::vector<uint8_t> random_matrix(DType dt, int64_t rows, int64_t cols, uint32_t salt,
                                   float scale) {
  std::mt19937 gen(salt);
  std::normal_distribution<float> normal(0.0f, scale);
  const std::size_t n = static_cast<std::size_t>(rows * cols);
  std::vector<uint8_t> out(n * dtype_size(dt));
  for (std::size_t i = 0; i < n; ++i) {
    const float v = normal(gen);
    if (dt == DType::fp32) {
      std::memcpy(out.data() + i * 4, &v, 4);
    } else {
      const uint16_t h = dt == DType::bf16 ? canon::float_to_bf16(v) : canon::float_to_fp16(v);
      std::memcpy(out.data() + i * 2, &h, 2);
    }
  }
  return out;
}

template <class Fn>
double best_seconds(int reps, const Fn& fn) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const DType dt = parse_dtype(a.dtype, "--dtype");
  const VocabLayout layout = megatron_bounds(a.vocab, 1);  // one rank's shard, tile-padded
  const int64_t padded = layout.padded_vocab_size;
  const std::vector<uint8_t> hidden = random_matrix(dt, a.tokens, a.hidden, 1, 1.0f);
  std::vector<uint8_t> weight = random_matrix(dt, padded, a.hidden, 2, 0.04f);
  std::vector<int64_t> targets(static_cast<std::size_t>(a.tokens));
  for (int64_t i = 0; i < a.tokens; ++i) targets[i] = (i * 7919) % a.vocab;
  const LogitsView hv{hidden.data(), dt, a.tokens, a.hidden, a.hidden};
  const LogitsView wv{weight.data(), dt, padded, a.hidden, a.hidden};
  const double flop = 2.0 * static_cast<double>(a.tokens) * static_cast<double>(a.vocab) *
                      static_cast<double>(a.hidden);

  const double peak1 = a.skip_peak ? 0 : bench::fma_peak_gflops(1, 1.0);
  const double peak = a.skip_peak ? 0 : bench::fma_peak_gflops(a.threads, 1.0);

  // linear_logits on a slice of the vocabulary (the [tokens, V] fp32 output would dominate
  // memory): the dot-product kernel alone.
  const int64_t slice = std::min<int64_t>(padded, 4096);
  std::vector<float> z(static_cast<std::size_t>(a.tokens * slice));
  const double lin_s = best_seconds(a.reps, [&] {
    linear_logits(hv, LogitsView{weight.data(), dt, slice, a.hidden, a.hidden},
                  MutableLogitsView{z.data(), DType::fp32, a.tokens, slice, slice},
                  {.threads = a.threads});
  });
  const double lin_gflops =
      2.0 * static_cast<double>(a.tokens * slice) * static_cast<double>(a.hidden) / lin_s / 1e9;
  std::vector<float>().swap(z);

  const LogprobContract c(
      {.role = Role::train,
       .dtype = dt,
       .mask = MaskSpec::all_active(a.tokens),
       .sharding = ShardingSpec({.tp_rank = 0,
                                 .tp_world_size = 1,
                                 .vocab_shard_bounds = layout.vocab_shard_bounds,
                                 .real_vocab_size = a.vocab,
                                 .padded_vocab_size = padded})});
  // Through the registry, as the command line and Python obtain it: the production backend.
  const FusedDispatchResult dispatched = get_fused_linear_logprob_op(c);
  const FusedLinearLogprob& op = *dispatched.op;
  SelfComm self;
  std::vector<float> g_logp(static_cast<std::size_t>(a.tokens), 1.0f);
  std::vector<uint8_t> gh(hidden.size()), gw(weight.size());
  FusedLogprobResult res;
  const double fwd_s = best_seconds(a.reps, [&] {
    res = op.forward(hv, wv, targets, c, self,
                     {.exec = {.threads = a.threads}, .row_block = a.row_block});
  });
  const double bwd_s = best_seconds(a.reps, [&] {
    op.backward(res, {.grad_logp = g_logp},
                MutableLogitsView{gh.data(), dt, a.tokens, a.hidden, a.hidden},
                MutableLogitsView{gw.data(), dt, padded, a.hidden, a.hidden}, self);
  });
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double floor_mb =
      static_cast<double>(2 * (hidden.size() + weight.size())) / (1024.0 * 1024.0);  // in + grads
  std::printf(
      "{\"bench\": \"fused\", \"kernel\": \"%s\", \"dtype\": \"%s\", \"tokens\": %lld, "
      "\"hidden\": %lld, \"local_vocab\": %lld, \"threads\": %d, \"fma_peak_gflops_1t\": %.2f, "
      "\"fma_peak_gflops\": %.2f, \"linear_logits_gflops\": %.2f, \"forward_s\": %.4f, "
      "\"forward_gflops\": %.2f, \"forward_vs_peak\": %.3f, \"backward_s\": %.4f, "
      "\"forward_backward_s\": %.4f, \"peak_rss_mb\": %.1f, \"inputs_and_grads_mb\": %.1f}\n",
      op.kernel_name().c_str(), a.dtype.c_str(), static_cast<long long>(a.tokens),
      static_cast<long long>(a.hidden), static_cast<long long>(a.vocab), a.threads, peak1, peak,
      lin_gflops, fwd_s, flop / fwd_s / 1e9, peak > 0 ? flop / fwd_s / 1e9 / peak : 0.0, bwd_s,
      fwd_s + bwd_s, static_cast<double>(ru.ru_maxrss) / 1024.0, floor_mb);
  return 0;
}
