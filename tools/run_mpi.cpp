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
#include "memory/memory.hpp"
#include "progress.hpp"
#include "rank_agreement.hpp"
#include "run_checks.hpp"
#include "run_report.hpp"
#include "run_scenario.hpp"
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

// This process's part of the batch: its place in TP x CP, its token slice and vocab shard.
struct RankPart {
  RankPlacement placement;
  TokenSlice slice;
  VocabRange shard;
};

RankPart rank_part(const RunOptions& o, const Topology& topo, const VocabLayout& layout, int rank,
                   int world) {
  const RankPlacement pl =
      place_rank(rank, world, static_cast<int>(topo.tp), static_cast<int>(topo.cp));
  return {.placement = pl,
          .slice = token_slice(o.tokens, topo.cp, pl.cp_rank),
          .shard = layout.vocab_shard_bounds[static_cast<std::size_t>(pl.tp_rank)]};
}

// Everything this process can check before any collective: the topology, whether the registry
// can serve the request at all (TP rank 0's contract), and whether this process's buffers fit
// in the memory available to it.
void preflight(const RunOptions& o, int world, int me) {
  parse_collective_timeout(o.collective_timeout);
  const Topology topo = topology(o, world);
  const RunScenario s = run_scenario(o, std::array{topo.tp});
  const RankPart part = rank_part(o, topo, s.layouts[0], me, world);
  const std::uint64_t esz = dtype_size(s.dtype);
  // This process's logits and gradient slice; rank 0 also gathers the whole gradient.
  const RunBuffer buffers[] = {{.name = "this process's logits and gradient",
                                .count = 2,
                                .rows = static_cast<std::uint64_t>(part.slice.count),
                                .cols = static_cast<std::uint64_t>(part.shard.size()),
                                .element_size = esz},
                               {.name = "the gathered gradient",
                                .rows = static_cast<std::uint64_t>(o.tokens),
                                .cols = static_cast<std::uint64_t>(o.real_vocab),
                                .element_size = esz}};
  require_run_memory(std::span(buffers, me == 0 ? 2u : 1u),
                     fmt::format("rank {} of --tokens {} x --real-vocab {} of {} at TP {} x CP {}",
                                 me, o.tokens, o.real_vocab, o.dtype, topo.tp, topo.cp),
                     "use fewer --tokens (or more processes)");
  SyntheticRows rows;  // any targets will do: only the contract's shape matters here
  rows.targets.assign(static_cast<std::size_t>(part.slice.count), 0);
  rows.active.assign(rows.targets.size(), true);
  ScoreRequest req = run_request(o, s, s.layouts[0], rows);
  req.cp_size = topo.cp;
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
          fmt::format("--softcap {}", o.softcap ? fmt::format("{}", *o.softcap) : "none"),
          fmt::format("--backend {}", o.backend),
          fmt::format("--collective-timeout {}", o.collective_timeout)};
}

// The outputs of the whole batch, on rank 0: each slice's logp, lse and entropy from its TP
// rank 0, and every process's gradient block (real columns only) into one [tokens, real]
// gradient. Point-to-point to rank 0; every process calls it.
struct GatheredOutputs {
  std::vector<float> logp, lse, entropy;
  std::vector<std::byte> grad;
};

GatheredOutputs gather_outputs(const RunOptions& o, const Topology& topo, const VocabLayout& layout,
                               const RankPart& part, const LogprobResult& mine,
                               const std::vector<std::byte>& grad, DType dtype, int me, int n) {
  const std::size_t esz = dtype_size(dtype);
  // This process's gradient block, real columns only, packed row by row.
  const int64_t real_cols =
      std::clamp<int64_t>(o.real_vocab - part.shard.start, 0, part.shard.size());
  std::vector<std::byte> packed(static_cast<std::size_t>(part.slice.count * real_cols) * esz);
  for (int64_t r = 0; r < part.slice.count; ++r) {
    std::memcpy(packed.data() + static_cast<std::size_t>(r * real_cols) * esz,
                grad.data() + static_cast<std::size_t>(r * part.shard.size()) * esz,
                static_cast<std::size_t>(real_cols) * esz);
  }
  GatheredOutputs out;
  if (me != 0) {
    if (part.placement.tp_rank == 0) {
      for (const auto* v : {&mine.logp, &mine.lse, &mine.entropy}) {
        send_bytes(v->data(), v->size() * sizeof(float), 0);
      }
    }
    send_bytes(packed.data(), packed.size(), 0);
    return out;
  }
  out.logp.resize(static_cast<std::size_t>(o.tokens));
  out.lse.resize(out.logp.size());
  out.entropy.resize(out.logp.size());
  out.grad = io::allocate_bytes(static_cast<std::size_t>(o.tokens * o.real_vocab) * esz,
                                "gathering the gradient");
  for (int r = 0; r < n; ++r) {
    const RankPart p = rank_part(o, topo, layout, r, n);
    const int64_t cols = std::clamp<int64_t>(o.real_vocab - p.shard.start, 0, p.shard.size());
    if (p.placement.tp_rank == 0) {
      const std::pair<std::vector<float>*, const std::vector<float>*> parts[] = {
          {&out.logp, &mine.logp}, {&out.lse, &mine.lse}, {&out.entropy, &mine.entropy}};
      for (const auto& [all, own] : parts) {
        float* dst = all->data() + p.slice.start;
        if (r == 0) {
          std::memcpy(dst, own->data(), own->size() * sizeof(float));
        } else {
          recv_bytes(dst, static_cast<std::size_t>(p.slice.count) * sizeof(float), r);
        }
      }
    }
    std::vector<std::byte> block;
    if (r == 0) {
      block = std::move(packed);
    } else {
      block.resize(static_cast<std::size_t>(p.slice.count * cols) * esz);
      recv_bytes(block.data(), block.size(), r);
    }
    for (int64_t row = 0; row < p.slice.count; ++row) {
      std::memcpy(
          out.grad.data() +
              static_cast<std::size_t>((p.slice.start + row) * o.real_vocab + p.shard.start) * esz,
          block.data() + static_cast<std::size_t>(row * cols) * esz,
          static_cast<std::size_t>(cols) * esz);
    }
  }
  return out;
}

int run_on_world(const RunOptions& o, MpiComm& world) {
  const int n = world.size();
  const int me = world.rank();
  const Topology topo = topology(o, n);
  const RunScenario s = run_scenario(o, std::array{topo.tp});
  const VocabLayout& layout = s.layouts[0];
  const int threads = rank_threads(s.threads, n, me);
  const std::size_t esz = dtype_size(s.dtype);

  MpiTpCpGroups groups = split_tp_cp(world, static_cast<int>(topo.tp), static_cast<int>(topo.cp));
  const RankPart part = rank_part(o, topo, layout, me, n);
  const TokenSlice& slice = part.slice;
  const VocabRange& shard = part.shard;

  Progress progress(me == 0);
  const std::string tag = fmt::format("[tp {} x cp {}] ", topo.tp, topo.cp);
  progress.step(tag + "generating synthetic logits...");
  const std::size_t slice_bytes = static_cast<std::size_t>(slice.count * shard.size()) * esz;
  std::vector<std::byte> logits = io::allocate_bytes(slice_bytes, "allocating the logits slice");
  std::vector<std::byte> grad = io::allocate_bytes(slice_bytes, "allocating the gradient slice");
  fill_logits(s.spec, slice.start, slice.start + slice.count, shard.start, shard.end, logits.data(),
              shard.size(), threads);
  const SyntheticRows rows = synthetic_rows(s.spec, slice.start, slice.start + slice.count);
  ScoreRequest req = run_request(o, s, layout, rows);
  req.cp_rank = part.placement.cp_rank;
  req.cp_size = topo.cp;
  req.on_phase = [&](const std::string& p) { progress.step(tag + p + "..."); };
  std::memset(grad.data(), 0xff, grad.size());
  const LogitsView shard_view{logits.data(), s.dtype, slice.count, shard.size(), shard.size()};
  const MutableLogitsView grad_view{grad.data(), s.dtype, slice.count, shard.size(), shard.size()};
  RankScore score = score_rank(groups.tp_group, req, shard_view, grad_view, threads);
  progress.step(tag + "gathering...");

  // Verdicts and timings over the world. (All-gathers of the world communicator: under its
  // collective timeout, like every collective of this command.)
  const int64_t real_cols = std::clamp<int64_t>(o.real_vocab - shard.start, 0, shard.size());
  struct Verdict {
    double times[2];
    int flags[2];
  };
  const Verdict verdict{
      {score.forward_seconds, score.backward_seconds},
      {replicated_in_group(groups.tp_group, score.result) ? 1 : 0,
       padding_is_zero(LogitsView{grad.data(), s.dtype, slice.count, shard.size(), shard.size()},
                       real_cols)
           ? 1
           : 0}};
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

  const GatheredOutputs all =
      gather_outputs(o, topo, layout, part, score.result, grad, s.dtype, me, n);
  int code = kExitOk;
  if (me == 0) {
    progress.step(tag + "checking...");
    const SyntheticRows all_rows = synthetic_rows(s.spec, 0, o.tokens);
    RunReport report = start_run_report(o, "mpi", s.threads, all_rows);
    report.world_size = n;
    TpRunReport r = judge_tp_run(
        o, s.spec, all_rows, score, layout,
        {.logp = all.logp,
         .lse = all.lse,
         .entropy = all.entropy,
         .grad = LogitsView{all.grad.data(), s.dtype, o.tokens, o.real_vocab, o.real_vocab}});
    r.forward_seconds = max_times[0];
    r.backward_seconds = max_times[1];
    r.replicated = all_flags[0] == 1;
    r.padding_grad_zero = all_flags[1] == 1;
    report.runs.push_back(std::move(r));
    progress.clear();
    code = print_run_report(report);
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
  const std::string problem = agree_on_options(
      world, [&] { preflight(o, world.size(), world.rank()); }, agreed_options(o));
  if (!problem.empty()) {
    // Rank 0 reports it for every rank, and the others wait at a barrier until it has: mpiexec
    // ends the whole job as soon as one process exits non-zero, which used to cut off rank 0's
    // message when another rank got there first.
    if (world.rank() == 0) {
      std::string line = fmt::format("detlogp run: error: {}", problem);
      std::replace(line.begin(), line.end(), '\n', ' ');
      line += '\n';
      std::fwrite(line.data(), 1, line.size(), stderr);  // one write, as the error path below
      std::fflush(stderr);
    }
    world.barrier();
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
