// `mpirun -np N detlogp run --comm mpi [--tp T --cp C]`: the world splits into C TP groups of T
// processes (split_tp_cp); tokens are split contiguously across CP ranks (the first N % C take
// one extra); each process generates only its token slice x vocab shard of the synthetic batch
// and scores it on its TP group; rank 0 gathers every slice's outputs and every process's
// gradient block and reports on the whole batch, so its digests equal the in-process TP=1
// digests of the same options.

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <cstring>
#include <iostream>

#include <fmt/format.h>

#include "cli.hpp"
#include "detlogp/mpi_comm.hpp"
#include "io/memory.hpp"
#include "progress.hpp"
#include "run_checks.hpp"
#include "run_report.hpp"
#include "scoring.hpp"
#include "synthetic.hpp"

namespace detlogp::cli {
namespace {

struct TokenSlice {
  int64_t start = 0;
  int64_t count = 0;
};

TokenSlice token_slice(int64_t tokens, int64_t cp, int64_t cp_rank) {
  const int64_t base = tokens / cp, extra = tokens % cp;
  return {cp_rank * base + std::min(cp_rank, extra), base + (cp_rank < extra ? 1 : 0)};
}

// Point-to-point in chunks (MPI counts are int).
constexpr std::size_t kChunk = std::size_t{1} << 30;

void send_bytes(const void* data, std::size_t n, int dest) {
  const auto* p = static_cast<const char*>(data);
  for (std::size_t off = 0; off < n; off += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, n - off));
    mpi_check(MPI_Send(p + off, count, MPI_BYTE, dest, 0, MPI_COMM_WORLD), "MPI_Send");
  }
}

void recv_bytes(void* data, std::size_t n, int source) {
  auto* p = static_cast<char*>(data);
  for (std::size_t off = 0; off < n; off += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, n - off));
    mpi_check(MPI_Recv(p + off, count, MPI_BYTE, source, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
              "MPI_Recv");
  }
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Every TP rank's logp, lse and entropy equal (all-gathered over the TP group).
bool replicated_in_group(Communicator& tp_group, const LogprobResult& res) {
  bool ok = true;
  for (const std::vector<float>* v : {&res.logp, &res.lse, &res.entropy}) {
    std::vector<float> all(v->size() * static_cast<std::size_t>(tp_group.size()));
    all_gather(tp_group, std::span<const float>(*v), std::span<float>(all));
    for (int r = 0; r < tp_group.size(); ++r) {
      if (std::memcmp(all.data() + r * v->size(), v->data(), v->size() * sizeof(float)) != 0) {
        ok = false;
      }
    }
  }
  return ok;
}

struct Topology {
  int64_t tp = 1, cp = 1;
};

// Checked identically on every process before any collective.
Topology topology(const RunOptions& o, int world) {
  if (o.cp < 1) throw UsageError(fmt::format("--cp must be >= 1; got {}", o.cp));
  Topology t{.tp = 0, .cp = o.cp};
  if (o.tp.empty()) {
    t.tp = world / o.cp;
  } else {
    const std::vector<int64_t> tps = parse_int_list(o.tp, "--tp");
    if (tps.size() != 1) {
      throw UsageError("--tp takes one degree under --comm mpi (the processes form TP x CP)");
    }
    t.tp = tps[0];
  }
  if (t.tp < 1 || t.tp * t.cp != world) {
    throw UsageError(
        fmt::format("world size {} does not match TP*CP = {} x {} (launch TP x CP processes)",
                    world, t.tp, t.cp));
  }
  if (o.tokens < t.cp) {
    throw UsageError(fmt::format("--tokens {} is fewer than the CP degree {}", o.tokens, t.cp));
  }
  return t;
}

// Everything this process can check before any collective: the topology, whether the registry
// can serve the request at all (TP rank 0's contract), and whether this process's buffers fit
// in the memory available to it.
void preflight(const RunOptions& o, int world, int me) {
  parse_collective_timeout(o.collective_timeout);
  const Topology topo = topology(o, world);
  const DType dtype = parse_dtype(o.dtype, "--dtype");
  const VocabLayout layout = run_layout(o.real_vocab, topo.tp, o.tile_width);
  const RankPlacement pl =
      place_rank(me, world, static_cast<int>(topo.tp), static_cast<int>(topo.cp));
  const TokenSlice slice = token_slice(o.tokens, topo.cp, pl.cp_rank);
  const VocabRange shard = layout.vocab_shard_bounds[static_cast<std::size_t>(pl.tp_rank)];
  const std::uint64_t esz = dtype_size(dtype);
  // This process's logits and gradient slice; rank 0 also gathers the whole gradient.
  const RunBuffer buffers[] = {{.name = "this process's logits and gradient",
                                .count = 2,
                                .rows = static_cast<std::uint64_t>(slice.count),
                                .cols = static_cast<std::uint64_t>(shard.size()),
                                .element_size = esz},
                               {.name = "the gathered gradient",
                                .rows = static_cast<std::uint64_t>(o.tokens),
                                .cols = static_cast<std::uint64_t>(o.real_vocab),
                                .element_size = esz}};
  require_run_memory(std::span(buffers, me == 0 ? 2u : 1u),
                     fmt::format("rank {} of --tokens {} x --real-vocab {} of {} at TP {} x CP {}",
                                 me, o.tokens, o.real_vocab, o.dtype, topo.tp, topo.cp),
                     "use fewer --tokens (or more processes)");
  const std::vector<int64_t> targets(static_cast<std::size_t>(slice.count), 0);
  const std::vector<bool> active(targets.size(), true);
  const ScoreRequest req{.dtype = dtype,
                         .real_vocab = o.real_vocab,
                         .padded_vocab = layout.padded_vocab_size,
                         .bounds = layout.vocab_shard_bounds,
                         .tile_width = o.tile_width,
                         .temperature = o.temperature,
                         .backend = o.backend,
                         .cp_size = topo.cp,
                         .targets = targets,
                         .active = &active};
  Registry::global().get_logprob_op(make_contract(req, 0), o.backend);
}

// The options every process must share, as "--name value" items (one per option).
std::vector<std::string> agreed_options(const RunOptions& o) {
  return {fmt::format("--tokens {}", o.tokens),
          fmt::format("--real-vocab {}", o.real_vocab),
          fmt::format("--dtype {}", o.dtype),
          fmt::format("--tp {}", o.tp.empty() ? "(default)" : o.tp),
          fmt::format("--cp {}", o.cp),
          fmt::format("--tile-width {}", o.tile_width),
          fmt::format("--batch-key {}", o.batch_key),
          fmt::format("--temperature {}", o.temperature),
          fmt::format("--backend {}", o.backend),
          fmt::format("--collective-timeout {}", o.collective_timeout)};
}

// One rank's contribution to the agreement: its preflight verdict and its options.
struct AgreementRecord {
  char ok = 1;
  std::array<char, 1024> error{};
  std::array<char, 1024> options{};
};

template <std::size_t N>
void put_text(std::array<char, N>& field, const std::string& text) {
  field.fill('\0');
  std::memcpy(field.data(), text.data(), std::min(text.size(), N - 1));
}

template <std::size_t N>
std::string get_text(const std::array<char, N>& field) {
  return std::string(field.data(), strnlen(field.data(), N));
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t nl = std::min(text.find('\n', pos), text.size());
    out.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return out;
}

// Every process checks its own options, then all of them exchange their verdicts and options in
// one small collective, before any split: either every process goes on, or every one stops
// with the first failing rank's message (rank 0 reports it; the others exit 2 quietly).
// Returns the message, empty when all agree.
std::string agree_on_options(const RunOptions& o, MpiComm& world) {
  AgreementRecord mine;
  try {
    preflight(o, world.size(), world.rank());
  } catch (const std::exception& e) {
    mine.ok = 0;
    put_text(mine.error, e.what());
  }
  std::string options;
  for (const std::string& item : agreed_options(o)) options += item + "\n";
  put_text(mine.options, options);
  std::vector<AgreementRecord> all(static_cast<std::size_t>(world.size()));
  all_gather(world, std::span<const AgreementRecord>(&mine, 1), std::span<AgreementRecord>(all));
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (!all[r].ok) {
      // Usually every rank fails alike and rank 0 says so in its own words.
      return r == 0 ? get_text(all[r].error)
                    : fmt::format("rank {}: {}", r, get_text(all[r].error));
    }
  }
  const std::vector<std::string> first = split_lines(get_text(all[0].options));
  for (std::size_t r = 1; r < all.size(); ++r) {
    const std::vector<std::string> other = split_lines(get_text(all[r].options));
    for (std::size_t k = 0; k < std::min(first.size(), other.size()); ++k) {
      if (first[k] != other[k]) {
        return fmt::format(
            "the processes disagree on their options: rank 0 has {} but rank {} has {}; launch "
            "every process with the same options",
            first[k], r, other[k]);
      }
    }
  }
  return {};
}

int run_on_world(const RunOptions& o, MpiComm& world) {
  const int n = world.size();
  const int me = world.rank();
  const Topology topo = topology(o, n);
  const DType dtype = parse_dtype(o.dtype, "--dtype");
  const VocabLayout layout = run_layout(o.real_vocab, topo.tp, o.tile_width);
  const SyntheticSpec spec{
      .tokens = o.tokens, .real_vocab = o.real_vocab, .dtype = dtype, .key = o.batch_key};
  const int total_threads = resolve_threads(o.threads);
  const int threads = rank_threads(total_threads, n, me);
  const std::size_t esz = dtype_size(dtype);

  MpiTpCpGroups groups = split_tp_cp(world, static_cast<int>(topo.tp), static_cast<int>(topo.cp));
  const RankPlacement& pl = groups.placement;
  const TokenSlice slice = token_slice(o.tokens, topo.cp, pl.cp_rank);
  const VocabRange shard = layout.vocab_shard_bounds[static_cast<std::size_t>(pl.tp_rank)];

  Progress progress(me == 0);
  const std::string tag = fmt::format("[tp {} x cp {}] ", topo.tp, topo.cp);
  progress.step(tag + "generating synthetic logits...");
  const std::size_t slice_bytes = static_cast<std::size_t>(slice.count * shard.size()) * esz;
  std::vector<std::byte> logits = io::allocate_bytes(slice_bytes, "allocating the logits slice");
  std::vector<std::byte> grad = io::allocate_bytes(slice_bytes, "allocating the gradient slice");
  fill_logits(spec, slice.start, slice.start + slice.count, shard.start, shard.end, logits.data(),
              shard.size(), threads);
  const SyntheticRows rows = synthetic_rows(spec, slice.start, slice.start + slice.count);
  ScoreRequest req{.dtype = dtype,
                   .real_vocab = o.real_vocab,
                   .padded_vocab = layout.padded_vocab_size,
                   .bounds = layout.vocab_shard_bounds,
                   .tile_width = o.tile_width,
                   .temperature = o.temperature,
                   .backend = o.backend,
                   .entropy = true,
                   .cp_rank = pl.cp_rank,
                   .cp_size = topo.cp,
                   .targets = rows.targets,
                   .active = &rows.active,
                   .grads = {.grad_logp = rows.grad_logp,
                             .grad_lse = rows.grad_lse,
                             .grad_entropy = rows.grad_entropy},
                   .on_phase = [&](const std::string& p) { progress.step(tag + p + "..."); }};
  std::memset(grad.data(), 0xff, grad.size());
  const LogitsView shard_view{.data = logits.data(),
                              .dtype = dtype,
                              .rows = slice.count,
                              .cols = shard.size(),
                              .row_stride = shard.size()};
  const MutableLogitsView grad_view{.data = grad.data(),
                                    .dtype = dtype,
                                    .rows = slice.count,
                                    .cols = shard.size(),
                                    .row_stride = shard.size()};
  RankScore score = score_rank(groups.tp_group, req, shard_view, grad_view, threads);
  progress.step(tag + "gathering...");

  // Verdicts and timings over the world.
  const int64_t real_cols = std::clamp<int64_t>(o.real_vocab - shard.start, 0, shard.size());
  const LogitsView grad_read{.data = grad.data(),
                             .dtype = dtype,
                             .rows = slice.count,
                             .cols = shard.size(),
                             .row_stride = shard.size()};
  // (All-gathers of the world communicator: under its collective timeout, like every collective
  // of this command.)
  struct Verdict {
    double times[2];
    int flags[2];
  };
  const Verdict verdict{{score.forward_seconds, score.backward_seconds},
                        {replicated_in_group(groups.tp_group, score.result) ? 1 : 0,
                         padding_is_zero(grad_read, real_cols) ? 1 : 0}};
  std::vector<Verdict> verdicts(static_cast<std::size_t>(n));
  all_gather(world, std::span<const Verdict>(&verdict, 1), std::span<Verdict>(verdicts));
  int all_flags[2] = {1, 1};
  double max_times[2] = {0, 0};
  for (const Verdict& v : verdicts) {
    for (int k = 0; k < 2; ++k) {
      all_flags[k] = std::min(all_flags[k], v.flags[k]);
      max_times[k] = std::max(max_times[k], v.times[k]);
    }
  }

  // This process's gradient block, real columns only, packed row by row.
  std::vector<std::byte> packed(static_cast<std::size_t>(slice.count * real_cols) * esz);
  for (int64_t r = 0; r < slice.count; ++r) {
    std::memcpy(packed.data() + static_cast<std::size_t>(r * real_cols) * esz,
                grad.data() + static_cast<std::size_t>(r * shard.size()) * esz,
                static_cast<std::size_t>(real_cols) * esz);
  }
  if (me != 0) {
    if (pl.tp_rank == 0) {
      for (const auto* v : {&score.result.logp, &score.result.lse, &score.result.entropy}) {
        send_bytes(v->data(), v->size() * sizeof(float), 0);
      }
    }
    send_bytes(packed.data(), packed.size(), 0);
  }
  int code = kExitOk;
  if (me == 0) {
    std::vector<float> logp(static_cast<std::size_t>(o.tokens)), lse(logp.size()),
        entropy(logp.size());
    std::vector<std::byte> full = io::allocate_bytes(
        static_cast<std::size_t>(o.tokens * o.real_vocab) * esz, "gathering the gradient");
    for (int r = 0; r < n; ++r) {
      const RankPlacement p =
          place_rank(r, n, static_cast<int>(topo.tp), static_cast<int>(topo.cp));
      const TokenSlice s = token_slice(o.tokens, topo.cp, p.cp_rank);
      const VocabRange b = layout.vocab_shard_bounds[static_cast<std::size_t>(p.tp_rank)];
      const int64_t cols = std::clamp<int64_t>(o.real_vocab - b.start, 0, b.size());
      if (p.tp_rank == 0) {
        for (std::vector<float>* v : {&logp, &lse, &entropy}) {
          float* dst = v->data() + s.start;
          const std::vector<float>& mine = v == &logp  ? score.result.logp
                                           : v == &lse ? score.result.lse
                                                       : score.result.entropy;
          if (r == 0) {
            std::memcpy(dst, mine.data(), mine.size() * sizeof(float));
          } else {
            recv_bytes(dst, static_cast<std::size_t>(s.count) * sizeof(float), r);
          }
        }
      }
      std::vector<std::byte> block;
      if (r == 0) {
        block = std::move(packed);
      } else {
        block.resize(static_cast<std::size_t>(s.count * cols) * esz);
        recv_bytes(block.data(), block.size(), r);
      }
      for (int64_t row = 0; row < s.count; ++row) {
        std::memcpy(
            full.data() + static_cast<std::size_t>((s.start + row) * o.real_vocab + b.start) * esz,
            block.data() + static_cast<std::size_t>(row * cols) * esz,
            static_cast<std::size_t>(cols) * esz);
      }
    }
    progress.step(tag + "checking...");
    const LogitsView full_grad{.data = full.data(),
                               .dtype = dtype,
                               .rows = o.tokens,
                               .cols = o.real_vocab,
                               .row_stride = o.real_vocab};
    const SyntheticRows all_rows = synthetic_rows(spec, 0, o.tokens);
    RunReport report;
    report.options = o;
    report.comm = "mpi";
    report.world_size = n;
    report.threads = total_threads;
    for (bool a : all_rows.active) report.active_tokens += a ? 1 : 0;
    TpRunReport r;
    r.tp = topo.tp;
    r.cp = topo.cp;
    r.padded_vocab = layout.padded_vocab_size;
    r.actual_backend = score.actual_backend;
    r.kernel = score.kernel;
    r.contract_fingerprint = score.contract_fingerprint;
    r.provenance = nlohmann::json::parse(score.provenance_json);
    r.forward_seconds = max_times[0];
    r.backward_seconds = max_times[1];
    r.replicated = all_flags[0] == 1;
    r.padding_grad_zero = all_flags[1] == 1;
    r.digests = compute_digests(logp, lse, entropy, full_grad, o.real_vocab);
    r.accuracy = check_sampled_rows(spec, all_rows, o.temperature, logp, lse, entropy, full_grad);
    report.runs.push_back(std::move(r));
    progress.clear();
    if (o.json) {
      std::cout << run_report_json(report).dump(2) << "\n";
    } else {
      std::cout << format_run_report(report);
    }
    std::cout.flush();
    code = report.passed() ? kExitOk : kExitCheckFailed;
  }
  std::vector<int> codes(static_cast<std::size_t>(n));
  all_gather(world, std::span<const int>(&code, 1), std::span<int>(codes));
  return codes[0];  // rank 0's verdict
}

}  // namespace

int run_mpi_command(const RunOptions& o, int* argc, char*** argv) {
  MpiSession session(argc, argv);
  // A bad --collective-timeout on some rank: the agreement still runs (under the default) and
  // reports it.
  MpiCommOptions comm_options;
  try {
    comm_options.collective_timeout = parse_collective_timeout(o.collective_timeout);
  } catch (const UsageError&) {
  }
  MpiComm world = MpiComm::world(comm_options);
  const std::string problem = agree_on_options(o, world);
  if (!problem.empty()) {
    if (world.rank() == 0) throw UsageError(problem);
    return kExitBadInput;
  }
  try {
    return run_on_world(o, world);
  } catch (const std::exception& e) {
    // A failure on one process would leave the others waiting in a collective: report it
    // and end the whole job.
    const std::string line =
        fmt::format("detlogp run: error on rank {}: {}\n", world.rank(), e.what());
    std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines of ranks stay whole
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, kExitBadInput);
    return kExitBadInput;
  }
}

}  // namespace detlogp::cli
