"""detlogp.torch over torch.distributed (gloo), 4 spawned ranks: TP = 2 and 4 bitwise equal to
TP = 1 for logp, entropy and gradients of shifted N-D logits; a GRPO loop's losses and updated
weights bitwise equal at TP = 1, 2, 4; the device transport path; every preflight mismatch
named on every rank; an exception on one rank fails every rank within seconds."""


import pytest
import torch

import detlogp
from helpers import assert_bitwise
from spawn import run_workers

WORLD = 4
TIMEOUT_S = 300
FAIL_FAST_S = 20  # far below any collective timeout: nobody waited for a peer


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import torch_api_worker

    return run_workers(torch_api_worker.main, tmp_path_factory.mktemp("torch_api"), WORLD,
                       TIMEOUT_S)[0]


def _shard(tp, rank):
    """The vocabulary columns (or lm_head rows) of ``rank``'s TP group position at degree tp."""
    w = 1024 // tp
    s = {1: 0, 2: rank % 2, 4: rank}[tp] * w
    return slice(s, s + w)


def _against_tp1(ranks, scenario, dtype, tp):
    """(rank, its result of ``scenario`` at TP=tp, its result at TP=1) for every rank."""
    for rank, res in enumerate(ranks):
        yield rank, res[f"{scenario} {dtype} tp{tp}"], res[f"{scenario} {dtype} tp1"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tp", [2, 4])
def test_logp_entropy_grads_bitwise_equal_to_tp1(ranks, dtype, tp):
    for rank, got, ref in _against_tp1(ranks, "logprobs", dtype, tp):
        assert_bitwise(got["logp"], ref["logp"], f"logp rank {rank}")
        assert_bitwise(got["entropy"], ref["entropy"], f"entropy rank {rank}")
        assert_bitwise(got["grad"], ref["grad"][..., _shard(tp, rank)], f"grad rank {rank}")
        # The inferred shard bounds are Megatron's.
        padded, bounds = detlogp.megatron_bounds(1000, tp)
        assert [tuple(b) for b in got["bounds"]] == [tuple(b) for b in bounds]
    fps = {r[f"logprobs {dtype} tp{tp}"]["fingerprint"] for r in ranks}
    assert len(fps) == 1  # one contract across every group of this TP degree


def test_device_transport_path_is_bitwise_equal(ranks):
    for res in ranks:
        got, ref = res["logprobs float32 tp4 device path"], res["logprobs float32 tp4"]
        for key in ("logp", "entropy", "grad"):
            assert_bitwise(got[key], ref[key], key)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tp", [2, 4])
def test_grpo_loop_bitwise_equal_across_tp(ranks, dtype, tp):
    for rank, got, ref in _against_tp1(ranks, "grpo", dtype, tp):
        assert_bitwise(got["losses"], ref["losses"], f"loss trajectory rank {rank}")
        assert_bitwise(got["weight"], ref["weight"][_shard(tp, rank)], f"weights rank {rank}")
        assert not torch.equal(ref["losses"][0], ref["losses"][-1])  # the loop did move


@pytest.mark.parametrize("part", ["mask", "sharding", "reduction", "temperature", "tile width",
                                  "row count", "targets", "dtype"])
def test_mismatch_names_the_part_on_every_rank(ranks, part):
    for rank, res in enumerate(ranks):
        got = res["mismatch " + part]
        assert got["message"].startswith(
            f"LogprobContractError: cross-rank preflight failed: ranks disagree on the {part}: "
            f"rank 0 has {part} "), (rank, got["message"])
        assert f"but rank 1 has {part} " in got["message"], (rank, got["message"])
        assert got["seconds"] < FAIL_FAST_S


@pytest.mark.parametrize("case,bad_rank,own", [
    ("meta tensor on rank 2", 2, "LogprobContractError: logits must be a CPU or CUDA tensor"),
    ("ValueError on rank 1", 1, "ValueError: boom on rank 1"),
    ("contract API TypeError on rank 3", 3, "TypeError: bad targets on rank 3"),
])
def test_an_exception_on_one_rank_fails_every_rank_fast(ranks, case, bad_rank, own):
    for rank, res in enumerate(ranks):
        got = res[case]
        assert got["seconds"] < FAIL_FAST_S, (rank, got)
        if rank == bad_rank:
            assert got["message"].startswith(own), got["message"]  # its own exception
        else:
            text = own.split(": ", 1)
            assert got["message"].startswith(
                f"LogprobContractError: cross-rank preflight failed: rank {bad_rank} failed "
                f"local validation: {text[0]}: {text[1]}"), (rank, got["message"])


def test_group_still_works_after_the_failures(ranks):
    for res in ranks:
        assert_bitwise(res["after failures"], ranks[0]["after failures"])
