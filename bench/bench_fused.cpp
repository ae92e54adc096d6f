// The fused lm_head benchmark (docs/benchmarks.md, "The fused lm_head"): in one run, this
// machine's fp32 FMA peak (fma_peak.cpp), a tuned BLAS's cblas_sgemm on the same product
// `hidden @ W.T` (OpenBLAS, fp32 only; null when built without it), the canonical dot-product
// throughput of linear_logits and of the fused forward against both, and the fused forward +
// backward time on one rank's shape (hidden [tokens, H], weight [local_vocab, H]). Times are
// wall-clock; the CPU seconds of the process beside them show how much of the machine the run
// got (on a loaded machine compare the ratios of one run, never runs with each other). Peak
// resident memory at the end (ru_maxrss) covers the whole process, sgemm's [tokens, vocab]
// output included: `--fused-only` runs the fused op alone (no FMA peak, linear_logits or sgemm)
// for its own memory. bf16 inputs: sgemm runs on their fp32 upcast (the same values and flops;
// the upcast is not timed). One JSON object on stdout (and one more, "fused_softcap" or
// "fused_kept", for each of --softcap and --kept); bench/fused_acceptance.sh runs the set.
//
//   bench_fused --tokens 512 --hidden 4096 --vocab 37984 --threads 2 --dtype fp32
//   bench_fused --tokens 4096 --hidden 2048 --vocab 32768 --threads 2 --dtype fp32
//   bench_fused ... --vocab 4096 --forward-only     (a quick run: a smaller vocabulary, no
//   backward)
//   bench_fused ... --dtype bf16 --fused-only       (the fused op's peak memory alone)
//   bench_fused ... --softcap 30     (also the same op with a logit softcap of 30, each run of
//   it interleaved with a plain one (A/B): its forward and backward times and their ratios to
//   the plain op's, in wall-clock and in CPU seconds)
//   bench_fused ... --kept 512       (also the same op with kept sets of 512 random ids per row,
//   the target among them, A/B as --softcap)
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
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

#if DETLOGP_BENCH_OPENBLAS
#include <cblas.h>
#endif

namespace {

using namespace detlogp;

struct Args {
  int64_t tokens = 512, hidden = 4096, vocab = 37984;
  int threads = 2, reps = 1;
  int64_t row_block = FusedOptions{}.row_block;  // the library's default unless --row-block
  std::string dtype = "fp32";
  bool skip_peak = false;
  bool forward_only = false;
  bool fused_only = false;  // no FMA peak, linear_logits or sgemm: the op's own memory
  float softcap = 0.0f;     // > 0: also time the op with this cap, A/B against the plain op
  int64_t kept = 0;         // > 0: also time the op with kept sets of this many ids, A/B
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
    {"--softcap", [](Args& a, const std::string& v) { a.softcap = std::stof(v); }},
    {"--kept", [](Args& a, const std::string& v) { a.kept = std::stoll(v); }},
};

// The options without a value, each with the flag it sets.
const std::pair<std::string_view, bool Args::*> kFlags[] = {
    {"--skip-peak", &Args::skip_peak},
    {"--forward-only", &Args::forward_only},
    {"--fused-only", &Args::fused_only},
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const auto* flag = std::find_if(std::begin(kFlags), std::end(kFlags),
                                    [&](const auto& f) { return f.first == k; });
    if (flag != std::end(kFlags)) {
      a.*(flag->second) = true;
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

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// The best wall time of `reps` runs, and the process's CPU seconds during that run.
struct Timing {
  double wall = 1e300, cpu = 0;
};

template <class Fn>
Timing best_seconds(int reps, const Fn& fn) {
  Timing best;
  for (int r = 0; r < reps; ++r) {
    const double c0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (wall < best.wall) best = Timing{wall, process_cpu_seconds() - c0};
  }
  return best;
}

// The fp32 values of a matrix of `dt` (a copy; fp32 input: as is).
std::vector<float> upcast(DType dt, const std::vector<uint8_t>& m) {
  const std::size_t n = m.size() / dtype_size(dt);
  std::vector<float> out(n);
  if (dt == DType::fp32) {
    std::memcpy(out.data(), m.data(), n * 4);
    return out;
  }
  for (std::size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, m.data() + i * 2, 2);
    out[i] = dt == DType::bf16 ? canon::bf16_to_float(h) : canon::fp16_to_float(h);
  }
  return out;
}

// cblas_sgemm of C[tokens, vocab] = hidden @ W.T on `threads` threads: the tuned-BLAS baseline
// of the same flops as the fused forward (bf16/fp16 inputs: on their fp32 upcast, made before
// the timing). A null time when the bench has no BLAS.
std::optional<Timing> sgemm_seconds(const Args& a, DType dt, const std::vector<uint8_t>& hidden,
                                    const std::vector<uint8_t>& weight, std::string* core) {
#if DETLOGP_BENCH_OPENBLAS
  openblas_set_num_threads(a.threads);
  *core = openblas_get_corename();
  const std::vector<float> x32 = upcast(dt, hidden), w32 = upcast(dt, weight);
  std::vector<float> c(static_cast<std::size_t>(a.tokens * a.vocab));
  const float* x = x32.data();
  const float* w = w32.data();
  const auto m = static_cast<blasint>(a.tokens);
  const auto n = static_cast<blasint>(a.vocab);
  const auto k = static_cast<blasint>(a.hidden);
  return best_seconds(a.reps, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, 0.0f, c.data(),
                n);
  });
#else
  (void)a, (void)dt, (void)hidden, (void)weight, (void)core;
  return std::nullopt;
#endif
}

std::string json_number(std::optional<double> v) {
  if (!v) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", *v);
  return buf;
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

  const bool skip_peak = a.skip_peak || a.fused_only;
  const double peak1 = skip_peak ? 0 : bench::fma_peak_gflops(1, 1.0);
  const double peak = skip_peak ? 0 : bench::fma_peak_gflops(a.threads, 1.0);

  // linear_logits on a slice of the vocabulary (the [tokens, V] fp32 output would dominate
  // memory): the dot-product kernel alone.
  double lin_gflops = 0;
  if (!a.fused_only) {
    const int64_t slice = std::min<int64_t>(padded, 4096);
    std::vector<float> z(static_cast<std::size_t>(a.tokens * slice));
    const double lin_s =
        best_seconds(a.reps, [&] {
          linear_logits(hv, LogitsView{weight.data(), dt, slice, a.hidden, a.hidden},
                        MutableLogitsView{z.data(), DType::fp32, a.tokens, slice, slice},
                        {.threads = a.threads});
        }).wall;
    lin_gflops =
        2.0 * static_cast<double>(a.tokens * slice) * static_cast<double>(a.hidden) / lin_s / 1e9;
  }
  std::string blas_core;
  const std::optional<Timing> sgemm =
      a.fused_only ? std::nullopt : sgemm_seconds(a, dt, hidden, weight, &blas_core);

  auto contract = [&](std::optional<float> softcap) {
    return LogprobContract(
        {.role = Role::train,
         .dtype = dt,
         .mask = MaskSpec::all_active(a.tokens),
         .sharding = ShardingSpec({.tp_rank = 0,
                                   .tp_world_size = 1,
                                   .vocab_shard_bounds = layout.vocab_shard_bounds,
                                   .real_vocab_size = a.vocab,
                                   .padded_vocab_size = padded}),
         .softcap = softcap});
  };
  // One op as the bench times it: its contract, the op from the registry (as the command line
  // and Python obtain it: the production backend), and its best forward and backward.
  struct Timed {
    LogprobContract c;
    FusedDispatchResult dispatched;
    std::vector<int64_t> kept_ids;  // [tokens, kept] or empty
    FusedLogprobResult res;
    Timing fwd, bwd{0, 0};
  };
  auto make_timed = [&](std::optional<float> softcap, int64_t kept) {
    LogprobContract c = contract(softcap);
    FusedDispatchResult d = get_fused_linear_logprob_op(c);
    // `kept` distinct random ids per row, the target first.
    std::vector<int64_t> ids(static_cast<std::size_t>(a.tokens * kept));
    std::mt19937_64 gen(3);
    std::uniform_int_distribution<int64_t> pick(0, a.vocab - 1);
    for (int64_t i = 0; i < a.tokens && kept > 0; ++i) {
      auto row = ids.begin() + i * kept;
      row[0] = targets[static_cast<std::size_t>(i)];
      for (int64_t n = 1; n < kept;) {
        const int64_t id = pick(gen);
        if (std::find(row, row + n, id) == row + n) row[n++] = id;
      }
    }
    return Timed{std::move(c), std::move(d), std::move(ids),
                 {},           {},           {a.forward_only ? 0.0 : 1e300, 0}};
  };
  Timed plain = make_timed(std::nullopt, 0);
  std::optional<Timed> capped, kept;
  if (a.softcap > 0) capped.emplace(make_timed(a.softcap, 0));
  if (a.kept > 0) kept.emplace(make_timed(std::nullopt, a.kept));
  const FusedLinearLogprob& op = *plain.dispatched.op;
  SelfComm self;
  std::vector<float> g_logp(static_cast<std::size_t>(a.tokens), 1.0f);
  std::vector<uint8_t> gh(hidden.size()), gw(weight.size());
  // One forward (and backward) of `t`, keeping its best times.
  auto run_once = [&](Timed& t) {
    const FusedLinearLogprob& o = *t.dispatched.op;
    const Timing f = best_seconds(1, [&] {
      t.res = o.forward(hv, wv, targets, t.c, self,
                        {.exec = {.threads = a.threads},
                         .row_block = a.row_block,
                         .kept = {.ids = t.kept_ids, .width = t.kept_ids.empty() ? 0 : a.kept}});
    });
    if (f.wall < t.fwd.wall) t.fwd = f;
    if (a.forward_only) return;
    const Timing b = best_seconds(1, [&] {
      o.backward(t.res, {.grad_logp = g_logp},
                 MutableLogitsView{gh.data(), dt, a.tokens, a.hidden, a.hidden},
                 MutableLogitsView{gw.data(), dt, padded, a.hidden, a.hidden}, self);
    });
    if (b.wall < t.bwd.wall) t.bwd = b;
  };
  for (int r = 0; r < a.reps; ++r) {  // A/B: each variant right after the plain op
    run_once(plain);
    if (capped) run_once(*capped);
    if (kept) run_once(*kept);
  }
  const Timing fwd = plain.fwd;
  const double fwd_s = fwd.wall;
  const Timing bwd = plain.bwd;
  const double bwd_s = bwd.wall;
  const double fwd_gflops = flop / fwd_s / 1e9;
  std::optional<double> sgemm_gflops, sgemm_s, sgemm_cpu_s, fwd_vs_sgemm;
  if (sgemm) {
    sgemm_s = sgemm->wall;
    sgemm_cpu_s = sgemm->cpu;
    sgemm_gflops = flop / sgemm->wall / 1e9;
    fwd_vs_sgemm = fwd_gflops / *sgemm_gflops;
  }
  const char* sgemm_input = !sgemm ? "none" : (dt == DType::fp32 ? "fp32" : "fp32 upcast");
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double floor_mb =
      static_cast<double>(2 * (hidden.size() + weight.size())) / (1024.0 * 1024.0);  // in + grads
  std::printf(
      "{\"bench\": \"fused\", \"kernel\": \"%s\", \"dtype\": \"%s\", \"tokens\": %lld, "
      "\"hidden\": %lld, \"local_vocab\": %lld, \"threads\": %d, \"fma_peak_gflops_1t\": %.2f, "
      "\"fma_peak_gflops\": %.2f, \"blas\": \"%s\", \"sgemm_input\": \"%s\", \"sgemm_s\": %s, "
      "\"sgemm_cpu_s\": %s, "
      "\"sgemm_gflops\": %s, \"linear_logits_gflops\": %.2f, \"forward_s\": %.4f, "
      "\"forward_cpu_s\": %.4f, \"forward_gflops\": %.2f, \"forward_vs_peak\": %.3f, "
      "\"forward_vs_sgemm\": %s, \"backward_s\": %s, \"backward_cpu_s\": %s, "
      "\"backward_vs_forward\": %s, \"forward_backward_s\": %s, \"peak_rss_mb\": %.1f, "
      "\"inputs_and_grads_mb\": %.1f, \"fused_only\": %s}\n",
      op.kernel_name().c_str(), a.dtype.c_str(), static_cast<long long>(a.tokens),
      static_cast<long long>(a.hidden), static_cast<long long>(a.vocab), a.threads, peak1, peak,
      sgemm ? ("OpenBLAS " + blas_core).c_str() : "none", sgemm_input, json_number(sgemm_s).c_str(),
      json_number(sgemm_cpu_s).c_str(), json_number(sgemm_gflops).c_str(), lin_gflops, fwd_s,
      fwd.cpu, fwd_gflops, peak > 0 ? fwd_gflops / peak : 0.0, json_number(fwd_vs_sgemm).c_str(),
      json_number(a.forward_only ? std::nullopt : std::optional<double>(bwd_s)).c_str(),
      json_number(a.forward_only ? std::nullopt : std::optional<double>(bwd.cpu)).c_str(),
      json_number(a.forward_only ? std::nullopt : std::optional<double>(bwd_s / fwd_s)).c_str(),
      json_number(a.forward_only ? std::nullopt : std::optional<double>(fwd_s + bwd_s)).c_str(),
      static_cast<double>(ru.ru_maxrss) / 1024.0, floor_mb, a.fused_only ? "true" : "false");
  // A variant against the plain op: its times and their ratios (wall-clock and CPU seconds).
  auto print_ab = [&](const char* bench, const std::string& variant, const Timed& t) {
    const double vf = t.fwd.wall, vb = t.bwd.wall;
    auto unless_forward_only = [&](double v) {
      return json_number(a.forward_only ? std::nullopt : std::optional<double>(v));
    };
    std::printf(
        "{\"bench\": \"%s\", %s, \"reps\": %d, \"forward_s\": %.4f, \"variant_forward_s\": "
        "%.4f, \"forward_ratio\": %.3f, \"forward_cpu_ratio\": %.3f, \"backward_s\": %s, "
        "\"variant_backward_s\": %s, \"backward_ratio\": %s, \"backward_cpu_ratio\": %s, "
        "\"forward_backward_ratio\": %s}\n",
        bench, variant.c_str(), a.reps, fwd_s, vf, vf / fwd_s, t.fwd.cpu / fwd.cpu,
        unless_forward_only(bwd_s).c_str(), unless_forward_only(vb).c_str(),
        unless_forward_only(vb / bwd_s).c_str(), unless_forward_only(t.bwd.cpu / bwd.cpu).c_str(),
        unless_forward_only((vf + vb) / (fwd_s + bwd_s)).c_str());
  };
  if (capped) {
    print_ab("fused_softcap", "\"softcap\": " + json_number(static_cast<double>(a.softcap)),
             *capped);
  }
  if (kept) print_ab("fused_kept", "\"kept\": " + std::to_string(a.kept), *kept);
  return 0;
}
