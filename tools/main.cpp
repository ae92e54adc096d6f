// detlogp command line: parses the options of each command with CLI11 and dispatches.
// Exit codes: 0 success, 1 a check failed, 2 bad input or usage (one line on stderr).

#include <CLI/CLI.hpp>

#include <iostream>
#include <new>
#include <string>

#include "cli.hpp"
#include "detlogp/detlogp.hpp"
#include "unknown_options.hpp"

namespace {

using namespace detlogp::cli;

// Messages stay on one line (a registry rejection list may hold newlines).
std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

// An option whose --help shows its default value.
template <typename T>
CLI::Option* add_defaulted(CLI::App& app, const std::string& name, T& value,
                           const std::string& help) {
  return app.add_option(name, value, help)->capture_default_str();
}

void add_run(CLI::App& app, RunOptions& o) {
  add_defaulted(app, "--tokens", o.tokens, "tokens in the batch");
  add_defaulted(app, "--real-vocab", o.real_vocab, "real (tokenizer) vocabulary");
  add_defaulted(app, "--dtype", o.dtype, "logits dtype: bf16, fp16 or fp32");
  app.add_option("--tp", o.tp,
                 "TP degrees, comma-separated (in-process, default 1,2,4); one degree under "
                 "--comm mpi (default: processes / cp)");
  add_defaulted(app, "--cp", o.cp, "CP degree (--comm mpi only): tokens split across CP ranks");
  add_defaulted(app, "--tile-width", o.tile_width, "vocab tile width W");
  add_defaulted(app, "--threads", o.threads, "threads in total (0: all hardware threads)");
  add_defaulted(app, "--batch-key", o.batch_key,
                "key of the synthetic batch (same key, same batch)");
  add_defaulted(app, "--temperature", o.temperature, "scores use logits / temperature");
  app.add_option(
      "--softcap", o.softcap,
      "logit softcap: scores use cap * tanh(logits / cap) / temperature (default: none)");
  add_defaulted(app, "--backend", o.backend,
                "registry request: auto, production, reference or an id");
  add_defaulted(app, "--comm", o.comm, "auto (mpi when launched by mpirun), in-process or mpi");
  add_defaulted(app, "--device", o.device, "cpu or cuda (logits on the GPU, the cuda backend)");
  add_defaulted(app, "--collective-timeout", o.collective_timeout,
                "seconds a rank waits in one collective for the others (0: no limit)");
  app.add_flag("--json", o.json, "print one JSON object instead of the table");
  app.add_flag("--fused", o.fused,
               "the fused lm_head: hidden states and an lm_head weight instead of logits "
               "(default --tokens 8)");
  add_defaulted(app, "--hidden", o.hidden, "--fused: hidden size H");
}

void add_logprob(CLI::App& app, LogprobOptions& o) {
  app.add_option("--logits", o.logits, "[tokens, padded] BF16/F16/F32 (.safetensors or .npy)")
      ->required();
  app.add_option("--targets", o.targets, "[tokens] I64/I32")->required();
  app.add_option("--mask", o.mask, "[tokens] BOOL/U8 (default: all active)");
  app.add_option("--real-vocab", o.real_vocab, "real vocabulary (default: the logits' width)");
  add_defaulted(app, "--tp", o.tp, "TP degree: tile-aligned shards on the in-process group");
  auto* tw = app.add_option("--tile-width", o.tile_width, "vocab tile width W (default 128)");
  auto* nt = app.add_option("--num-vocab-tiles", o.num_vocab_tiles,
                            "K tiles: W = padded / K (must divide)");
  tw->excludes(nt);
  nt->excludes(tw);
  add_defaulted(app, "--temperature", o.temperature, "scores use logits / temperature");
  app.add_option("--row-temperature", o.row_temperature,
                 "[tokens] F32 per-token temperatures, each row's instead of --temperature");
  auto* kept = app.add_option(
      "--kept-ids", o.kept_ids,
      "[tokens, K] I64/I32 each token's kept vocabulary ids, -1 padded: logp, LSE and "
      "entropy over that set");
  auto* top_k = app.add_option("--top-k", o.top_k,
                               "every token's kept set recomputed as its top_k ids (1..1024)");
  auto* top_p = app.add_option("--top-p", o.top_p,
                               "every token's kept set recomputed by top-p (in (0, 1]), within "
                               "--top-k when given");
  kept->excludes(top_k)->excludes(top_p);
  app.add_option("--empty-kept", o.empty_kept,
                 "a --kept-ids row of only -1: error (default) or full (scored over the full "
                 "vocabulary, as without --kept-ids)")
      ->check(CLI::IsMember({"error", "full"}))
      ->needs(kept);
  app.add_option(
      "--softcap", o.softcap,
      "logit softcap: scores use cap * tanh(logits / cap) / temperature (default: none)");
  add_defaulted(app, "--backend", o.backend, "registry request");
  add_defaulted(app, "--device", o.device, "cpu or cuda (logits on the GPU, the cuda backend)");
  app.add_flag("--entropy", o.entropy, "also compute the entropy");
  app.add_option("--grad-logp", o.grad_logp, "[tokens] F32 upstream gradient of logp");
  app.add_option("--grad-lse", o.grad_lse, "[tokens] F32 upstream gradient of lse");
  app.add_option("--grad-entropy", o.grad_entropy,
                 "[tokens] F32 upstream gradient of entropy (needs --entropy)");
  add_defaulted(app, "--deterministic", o.deterministic,
                "true: the canon (cross-TP bitwise); false: fixed-topology fast mode");
  add_defaulted(app, "--threads", o.threads, "threads in total (0: all)");
  add_defaulted(app, "--collective-timeout", o.collective_timeout,
                "seconds a rank waits in one collective for the others (0: no limit)");
  app.add_option("--out", o.out, "output .safetensors (logp, lse, entropy, grad_logits)")
      ->required();
  app.add_option("--provenance", o.provenance, "write the dispatch provenance JSON here");
}

void add_drift(CLI::App& app, DriftOptions& o) {
  app.add_option("--candidate", o.candidate, "[tokens] F32 logprobs (e.g. recomputed)")->required();
  app.add_option("--reference", o.reference, "[tokens] F32 logprobs (e.g. rollout)")->required();
  app.add_option("--mask", o.mask, "[tokens] BOOL/U8 (default: all active)");
  add_defaulted(app, "--dtype", o.dtype, "tolerance table: bf16, fp16 or fp32");
  app.add_flag("--json", o.json, "print the report as JSON");
}

void add_bench(CLI::App& app, BenchOptions& o) {
  add_defaulted(app, "--tokens", o.tokens, "tokens");
  add_defaulted(app, "--real-vocab", o.real_vocab, "vocabulary");
  add_defaulted(app, "--dtype", o.dtype, "logits dtype");
  add_defaulted(app, "--threads", o.threads, "threads (0: all)");
  add_defaulted(app, "--repeats", o.repeats, "timed repetitions (median reported)");
  add_defaulted(app, "--batch-key", o.batch_key, "key of the synthetic logits");
  add_defaulted(app, "--device", o.device, "cpu or cuda (logits on the GPU, the cuda backend)");
  app.add_flag("--json", o.json, "print JSON");
}

void add_rollout(CLI::App& app, RolloutOptions& o) {
  add_defaulted(app, "--rows", o.rows, "rows (one sampled token each)");
  add_defaulted(app, "--real-vocab", o.real_vocab, "real (tokenizer) vocabulary");
  add_defaulted(app, "--dtype", o.dtype, "logits dtype: bf16, fp16 or fp32");
  add_defaulted(app, "--pairs", o.pairs,
                "ROLLOUT_TP:TRAIN_TP pairs, comma-separated: sampled at vLLM's layout at "
                "ROLLOUT_TP, scored at Megatron's at TRAIN_TP (in-process groups)");
  add_defaulted(app, "--batch-key", o.batch_key, "key of the synthetic logits and requests");
  add_defaulted(app, "--threads", o.threads, "threads in total (0: all)");
  add_defaulted(app, "--collective-timeout", o.collective_timeout,
                "seconds a rank waits in one collective for the others (0: no limit)");
  app.add_flag("--json", o.json, "print one JSON object instead of the table");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"detlogp: deterministic vocab-parallel log-probabilities"};
  app.require_subcommand(0, 1);
  bool version = false;
  app.add_flag("--version", version, "print the version");

  RunOptions run_opts;
  LogprobOptions logprob_opts;
  DriftOptions drift_opts;
  BenchOptions bench_opts;
  RolloutOptions rollout_opts;
  CLI::App* run = app.add_subcommand(
      "run", "the main job: a synthetic Qwen3-shaped batch at TP 1, 2, 4, checked bitwise");
  CLI::App* logprob = app.add_subcommand("logprob", "logprobs (and gradients) of tensor files");
  CLI::App* drift = app.add_subcommand("drift", "drift report of two logprob files");
  CLI::App* bench = app.add_subcommand("bench", "benchmarks of the CPU (or --device cuda) backend");
  CLI::App* rollout = app.add_subcommand(
      "rollout",
      "tokens sampled at vLLM's layout, scored at Megatron's: logprobs compared bitwise");
  CLI::App* version_cmd = app.add_subcommand("version", "print the version");
  for (CLI::App* sub : {run, logprob, drift, bench, rollout}) {
    sub->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  add_run(*run, run_opts);
  add_logprob(*logprob, logprob_opts);
  add_drift(*drift, drift_opts);
  add_bench(*bench, bench_opts);
  add_rollout(*rollout, rollout_opts);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // An unknown option first: a typo (--logit) is usually why a required option is missing.
    const std::string unknown = unknown_options_message(app);
    const std::vector<CLI::App*> parsed = app.get_subcommands();
    const std::string name = parsed.empty() ? "detlogp" : "detlogp " + parsed[0]->get_name();
    std::cerr << name << ": " << one_line(unknown.empty() ? e.what() : unknown) << " (see " << name
              << " --help)\n";
    return kExitBadInput;
  }
  const char* command = "detlogp";
  try {
    if (version || version_cmd->parsed()) {
      std::cout << "detlogp " << detlogp::version() << " (numerics " << detlogp::kNumericsVersion
                << ")\n";
      return kExitOk;
    }
    if (run->parsed()) {
      command = "detlogp run";
      if (run_opts.fused && run->count("--tokens") == 0) run_opts.tokens = 8;
      return run_command(run_opts, &argc, &argv);
    }
    if (logprob->parsed()) {
      command = "detlogp logprob";
      return logprob_command(logprob_opts);
    }
    if (drift->parsed()) {
      command = "detlogp drift";
      return drift_command(drift_opts);
    }
    if (rollout->parsed()) {
      command = "detlogp rollout";
      return rollout_command(rollout_opts);
    }
    if (bench->parsed()) {
      command = "detlogp bench";
      return bench_command(bench_opts);
    }
    std::cerr << app.help();
    return kExitBadInput;
  } catch (const std::bad_alloc&) {
    // The commands check their big allocations up front; this is the last line of defence.
    std::cerr << command
              << ": error: out of memory (an allocation failed); use a smaller input or fewer "
                 "--tokens\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    // ContractError and UsageError (bad input), std::runtime_error (no backend fits, a file
    // system failure): all reported on one line, exit 2.
    std::cerr << command << ": error: " << one_line(e.what()) << "\n";
    return kExitBadInput;
  }
}
