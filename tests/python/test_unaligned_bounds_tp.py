"""Shard bounds that are not multiples of the tile width at TP=3 over gloo (spawned ranks):
vLLM's layout of Qwen3's vocabulary (a vocab_start table, bf16 and fp32) and even shards of
1000 columns (with softcap and temperature) give the TP=1 bits (logp, entropy, the gradient of
each rank's columns); ranks whose tables disagree fail together."""

import pytest

from helpers import assert_bitwise
from spawn import run_workers

TIMEOUT_S = 240


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import unaligned_bounds_worker

    return run_workers(unaligned_bounds_worker.main, tmp_path_factory.mktemp("unaligned"), 3,
                       TIMEOUT_S, pass_world=False)[0]


@pytest.mark.parametrize("case", ["vllm bfloat16", "vllm float32", "even"])
def test_unaligned_shards_give_the_tp1_bits(ranks, case):
    for rank, res in enumerate(ranks):
        got, ref = res[case], res[case + " reference"]
        assert "error" not in got, (rank, case, got.get("error"))
        assert_bitwise(got["logp"], ref["logp"], f"{case} logp rank {rank}")
        assert_bitwise(got["entropy"], ref["entropy"], f"{case} entropy rank {rank}")
        assert_bitwise(got["grad"], ref["grad"], f"{case} grad rank {rank}")


def test_ranks_that_disagree_on_the_bounds_fail_together(ranks):
    for res in ranks:
        got = res["disagree"]
        assert "disagree" in got.get("error", ""), got
