"""The fused lm_head with shard bounds that are not multiples of the tile width at TP=3 over
gloo (spawned ranks): vLLM's layout of Qwen3's vocabulary (a vocab_start table; bf16 and fp32;
fused_vocab_parallel_logprobs and fused_linear_logprobs), even shards of 1000 rows (with
softcap and temperature) and a DTensor weight give the TP=1 bits: logp, entropy, LSE and
grad_hidden on every rank, each rank's grad_weight rows; ranks whose tables disagree fail
together."""

import pytest
import torch

import fused_unaligned_bounds_worker as fw
from helpers import assert_bitwise
from spawn import run_workers

TIMEOUT_S = 300


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_workers(fw.main, tmp_path_factory.mktemp("fused_unaligned"), fw.TP, TIMEOUT_S,
                       pass_world=False)[0]


def _reference(case):
    """The case at TP=1 (one rank, the whole weight) and every rank's rows."""
    import detlogp

    bounds, padded = fw.vllm_bounds(fw.REAL, fw.TP)
    if case.startswith("vllm") or case == "linear":
        dtype = torch.bfloat16 if case.endswith("bfloat16") else torch.float32
        hidden, weight, ids = fw.problem(dtype, padded)
        ref = fw.run(hidden, weight, ids, detlogp.SelfComm(), linear=case == "linear")
        return ref, bounds
    hidden, weight, ids = fw.problem(torch.float32, 3000)
    kw = {"softcap": 20.0, "temperature": 0.7} if case == "even" else {}
    ref = fw.run(hidden, weight, ids, detlogp.SelfComm(), real_vocab=2900, **kw)
    return ref, [(r * 1000, (r + 1) * 1000) for r in range(fw.TP)]


@pytest.mark.parametrize("case", ["vllm bfloat16", "vllm float32", "linear", "even", "dtensor"])
def test_unaligned_shards_give_the_tp1_bits(ranks, case):
    ref, bounds = _reference(case)
    assert "error" not in ref, ref
    for rank, res in enumerate(ranks):
        got = res[case]
        assert "error" not in got, (rank, case, got.get("error"))
        for name in ("logp", "entropy", "lse", "grad_hidden"):
            if ref[name] is not None:
                assert_bitwise(got[name], ref[name], f"{case} {name} rank {rank}")
        s, e = bounds[rank]
        assert_bitwise(got["grad_weight"], ref["grad_weight"][s:e],
                       f"{case} grad_weight rank {rank}")


def test_ranks_that_disagree_on_the_bounds_fail_together(ranks):
    for res in ranks:
        got = res["disagree"]
        assert "disagree" in got.get("error", ""), got
