"""Rollout at one layout, training at another, end to end (grpo_worker.py: four gloo ranks):
a toy policy sampled by ``detlogp.sample`` at vLLM's layout (TP 3 and 4, shard bounds off the
128-column tile) and trained by ``vocab_parallel_logprobs`` at Megatron's (TP 1 and 2) for
several GRPO iterations, with and without per-request temperature, top-k and top-p. Over
110592 tokens, no token's trainer logprob differs in any bit from the logprob the rollout
sampled it with (recomputed kept sets and replayed ones alike), the lm_head's update has the
same bits at TP 1 and 2, and the importance ratio is exactly 1. The same tokens scored with
plain torch on each side (log_softmax of the gathered rows; Megatron's vocab-parallel
log-softmax) are counted, and printed."""

import pytest

from spawn import run_workers

TIMEOUT_S = 600
LOOPS = ["tp3 plain", "tp3 sampling", "tp4 plain", "tp4 sampling"]


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    import grpo_worker

    ranks = run_workers(grpo_worker.main, tmp_path_factory.mktemp("grpo"), grpo_worker.WORLD,
                        TIMEOUT_S, pass_world=False)[0]
    return ranks[0]


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("tp_train", [1, 2])
def test_trainer_logprobs_are_the_rollout_bits(counts, loop, tp_train):
    c = counts[loop]
    assert c["tokens"] > 0
    # The logprob the loss takes (restricted rows: kept sets recomputed on even iterations,
    # replayed on odd ones) against the sampler's logprobs, the full-vocabulary one against
    # its full_logprobs.
    assert c[f"tp{tp_train} logp"] == 0, c
    assert c[f"tp{tp_train} full"] == 0, c


@pytest.mark.parametrize("loop", LOOPS)
def test_the_loop_is_on_policy_at_every_layout(counts, loop):
    c = counts[loop]
    assert c["rollout_ranks_differ"] == 0, c  # every rollout rank drew the same tokens
    assert c["kept_differ"] == 0, c  # the trainer's recomputed sets are the sampler's
    assert c["ratio_not_one"] == 0, c  # exp(logp - rollout logp) is exactly 1
    assert c["updates_differ"] == 0, c  # the lm_head gradient: same bits at TP 1 and 2
    assert c["oracle_excess"] <= 1, c  # every logprob within its bound of a float64 oracle


def test_restricted_greedy_and_plain_rows_all_ran(counts):
    assert counts["tp3 plain"]["restricted_tokens"] == 0
    for loop in ("tp3 sampling", "tp4 sampling"):
        c = counts[loop]
        assert 0 < c["restricted_tokens"] < c["tokens"], c
        assert c["recomputed_tokens"] > 0 and c["replayed_tokens"] > 0, c
        assert 0 < c["greedy_tokens"] < c["tokens"], c


def test_tp3_and_tp4_rollouts_draw_the_same_tokens(counts):
    import torch

    # The TP 3 and TP 4 loops' first iterations draw with the same seeds: the same tokens,
    # logprobs and updated lm_head, whichever layout sampled them.
    for config in ("plain", "sampling"):
        a, b = counts[f"tp3 {config}"]["first"], counts[f"tp4 {config}"]["first"]
        assert torch.equal(a["tokens"], b["tokens"])
        for name in ("logp", "W"):
            assert torch.equal(a[name].view(torch.int32), b[name].view(torch.int32)), name


def test_over_100000_tokens_and_the_plain_torch_counts(counts):
    for loop in LOOPS:
        c = counts[loop]
        print(f"{loop}: {c['tokens']} tokens, detlogp differ: TP1 {c['tp1 logp']}, TP2 "
              f"{c['tp2 logp']}; plain torch differ: log_softmax {c['plain']}, matmul + "
              f"log_softmax {c['plain_mm']}; worst error / float64 bound "
              f"{c['oracle_excess']:.3f}; mean reward by iteration "
              f"{[round(r, 3) for r in c['reward']]}")
        assert isinstance(c["plain"], int) and isinstance(c["plain_mm"], int)
    assert sum(counts[loop]["tokens"] for loop in LOOPS) >= 100000
