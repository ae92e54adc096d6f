"""Rows mean the same tokens on every TP rank whatever the memory layout of the logits.

Two gloo ranks pass the same logical [b, s, v/tp] logits, one as a transposed view of
Megatron's [s, b, v/tp] buffer and one contiguous (with targets all equal and all active, so
that nothing but the row order differs), or one as the causal shift view and one as its
.contiguous() copy: both get the TP=1 bits, logp, entropy and gradients. Ranks that share a
layout are still read in place (one forward, the caller's buffer). Empty micro-batches give
empty outputs at TP=2, and a rank with tokens next to an empty one fails both together."""


import pytest
import torch

from helpers import assert_bitwise
from spawn import run_workers

TIMEOUT_S = 240
W = 512


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import layout_worker

    return run_workers(layout_worker.main, tmp_path_factory.mktemp("layouts"), 2, TIMEOUT_S,
                       pass_world=False)[0]


def _assert_tp1_bits(got, ref, rank):
    assert "error" not in got, (rank, got.get("error"))
    assert_bitwise(got["logp"], ref["logp"], f"logp rank {rank}")
    assert_bitwise(got["entropy"], ref["entropy"], f"entropy rank {rank}")
    assert_bitwise(got["grad"], ref["grad"], f"grad rank {rank}")


@pytest.mark.parametrize("case,ref", [
    ("transposed vs contiguous, equal targets", "reference equal targets"),
    ("transposed vs contiguous", "reference"),
    ("shift vs contiguous", "reference shift"),
])
def test_mixed_layouts_give_the_tp1_bits_on_every_rank(ranks, case, ref):
    for rank, res in enumerate(ranks):
        _assert_tp1_bits(res[case], res[ref], rank)
    # The rank whose rows were not the tokens in order read them again from a copy; the
    # other read its own buffer both times (one call, joined twice).
    first, second = ranks[0][case]["reads"], ranks[1][case]["reads"]
    assert len(first) == 2 and first[0]["layout"] != "" and first[1]["layout"] == ""
    assert len(second) == 1 and second[0]["layout"] == ""
    if not case.startswith("shift"):
        assert second[0]["ptr"] == ranks[1][case]["base_ptr"] + W * 4  # its own buffer


@pytest.mark.parametrize("case,ref,shift", [("both shift", "reference shift", True),
                                            ("both transposed", "reference", False)])
def test_one_layout_on_every_rank_is_read_in_place(ranks, case, ref, shift):
    for rank, res in enumerate(ranks):
        _assert_tp1_bits(res[case], res[ref], rank)
        reads = res[case]["reads"]
        assert len(reads) == 1 and reads[0]["layout"] != ""  # one forward, no copy
        assert reads[0]["ptr"] == res[case]["base_ptr"] + rank * W * 4  # the caller's buffer


@pytest.mark.parametrize("case,shape", [("empty batch", (0, 5)), ("empty seq", (3, 0))])
def test_empty_micro_batches_give_empty_outputs_at_tp2(ranks, case, shape):
    for res in ranks:
        got = res[case]
        assert got["logp"].shape == got["entropy"].shape == shape
        assert got["logp"].dtype == torch.float32
        assert got["grad"].shape == shape + (W,)


def test_a_rank_with_tokens_next_to_an_empty_one_fails_both(ranks):
    for rank, res in enumerate(ranks):
        got = res["one rank empty"]
        assert got["error"].startswith("LogprobContractError: cross-rank preflight failed: "
                                       "ranks disagree on the row count: rank 0 has row count "
                                       "0 but rank 1 has row count "), (rank, got)
        assert got["seconds"] < 20


def test_fused_lm_head_without_tokens_at_tp2(ranks):
    for res in ranks:
        got = res["fused empty"]
        assert got["logp"].shape == got["lse"].shape == (0,)
        assert got["grad_hidden"].shape == (0, 16)
        assert got["grad_weight"].shape == (W, 16) and not got["grad_weight"].any()


def test_group_still_works_after_the_layout_cases(ranks):
    for rank, res in enumerate(ranks):
        _assert_tp1_bits(res["after"], res["reference"], rank)
