"""TP = 2 and 4 over torch.distributed (gloo) with torch.multiprocessing: logp, LSE, entropy
and gradients bitwise equal to TP=1; preflight mismatches raise on every rank. Every run is
under a timeout (a hang fails the test instead of blocking it)."""

import pathlib

import pytest
import torch

import detlogp
from helpers import assert_bitwise, contract, problem
from spawn import spawn_ranks

HERE = pathlib.Path(__file__).parent
REAL, PADDED, W = 1000, 1024, 64
TIMEOUT_S = 180


def run_world(tmp_path, world, data):
    """Spawns `world` ranks of dist_worker.main; returns each rank's result dict."""
    import dist_worker

    data_file = tmp_path / "data.pt"
    torch.save(data, data_file)
    init_file = tmp_path / "rendezvous"
    results, _ = spawn_ranks(dist_worker.main,
                             lambda r: (r, world, str(init_file), str(data_file), str(tmp_path),
                                        str(HERE)),
                             world, tmp_path, TIMEOUT_S)
    return results


@pytest.fixture(scope="module")
def world4(tmp_path_factory):
    x, t, mask = problem(n=29, stream=42, inactive=(0, 5, 6))
    g = torch.Generator().manual_seed(7)
    weights = [torch.randn(len(t), generator=g) for _ in range(3)]
    data = dict(x=x, t=t, mask=mask, weights=weights, real=REAL, padded=PADDED, tile_width=W)
    return data, run_world(tmp_path_factory.mktemp("world4"), 4, data)


def tp1(data, dtype, entropy=True):
    """The TP=1 outputs and full-vocabulary gradient, in this process."""
    x, t, mask, weights = data["x"], data["t"], data["mask"], data["weights"]
    c = contract(len(t), REAL, PADDED, mask=mask, dtype=dtype, tile_width=W)
    op, _ = detlogp.get_logprob_op(c)
    leaf = x.to({"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]).detach().clone()
    leaf.requires_grad_()
    outs = op(leaf, t, contract=c, entropy=entropy)
    sum((w * o).sum() for w, o in zip(weights, outs)).backward()
    res = {"logp": outs[0].detach(), "lse": outs[1].detach(), "grad": leaf.grad}
    if entropy:
        res["entropy"] = outs[2].detach()
    return res


def check_against_tp1(results, ref, name, bounds, ranks_of):
    for rank, tp_rank in ranks_of:
        got = results[rank][name]
        for key in ("logp", "lse", "entropy"):
            if key in ref and key in got:
                assert_bitwise(got[key], ref[key], f"{name} rank {rank} {key}")
        if "grad" in got:
            s, e = bounds[tp_rank]
            assert got["grad"].dtype == ref["grad"].dtype
            assert_bitwise(got["grad"], ref["grad"][:, s:e], f"{name} rank {rank} grad")


UNEVEN = [(0, 192), (192, 512), (512, 896), (896, 1024)]
TP2 = [(0, 512), (512, 1024)]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_tp4_bitwise_equal_to_tp1(world4, dtype):
    data, results = world4
    ref = tp1(data, dtype)
    check_against_tp1(results, ref, f"tp4_{dtype}", UNEVEN, [(r, r) for r in range(4)])
    fps = {res[f"tp4_{dtype}"]["fingerprint"] for res in results}
    assert len(fps) == 1
    assert {res[f"tp4_{dtype}"]["backend"] for res in results} == {
        detlogp.CPU_CANONICAL_BACKEND_ID}


def test_tp4_numpy_input_bitwise_equal_to_tp1(world4):
    data, results = world4
    check_against_tp1(results, tp1(data, "fp32"), "tp4_numpy", UNEVEN,
                      [(r, r) for r in range(4)])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_tp2_subgroups_bitwise_equal_to_tp1(world4, dtype):
    data, results = world4
    check_against_tp1(results, tp1(data, dtype), f"tp2_{dtype}", TP2,
                      [(r, r % 2) for r in range(4)])


@pytest.mark.parametrize("scenario,phrase", [
    # tile_width is part of the contract, so the fingerprints already differ
    ("mismatch_tile_width", "cross-rank preflight failed: ranks disagree on the tile width: rank 0 has tile width"),
    ("mismatch_tile_width_validate_off", "cross-rank preflight failed"),
    ("mixed_deterministic", "cross-rank preflight failed: ranks disagree on the deterministic mode: rank 0 has deterministic mode false"),
    ("wrong_group_size", "tp_world_size=2"),
])
def test_preflight_mismatch_raises_on_every_rank(world4, scenario, phrase):
    _, results = world4
    for rank, res in enumerate(results):
        msg = res[scenario]
        assert msg.startswith("LogprobContractError: "), (rank, msg)
        assert phrase in msg, (rank, msg)


def test_local_error_on_one_rank_raises_on_every_rank(world4):
    _, results = world4
    for rank, res in enumerate(results):
        msg = res["local_error_one_rank"]
        assert msg.startswith("LogprobContractError: "), (rank, msg)
        assert "active target_ids must lie in the real vocabulary" in msg, (rank, msg)
        if rank != 1:
            assert "rank 1 failed local validation" in msg, (rank, msg)


def test_python_side_rejection_on_one_rank_raises_on_every_rank(world4):
    _, results = world4
    for rank, res in enumerate(results):
        msg = res["python_check_one_rank"]
        assert msg.startswith("LogprobContractError: "), (rank, msg)
        if rank != 1:
            assert "rank 1 failed local validation" in msg, (rank, msg)


def test_group_still_usable_after_failures_and_comm_basics(world4):
    data, results = world4
    ref = tp1(data, "fp32", entropy=False)
    check_against_tp1(results, ref, "tp4_after_failures", UNEVEN, [(r, r) for r in range(4)])
    for rank, res in enumerate(results):
        r, size, name, gathered, empty = res["comm"]
        assert (r, size, name) == (rank, 4, "torch.distributed:gloo")
        assert gathered == bytes([0, 10, 1, 11, 2, 12, 3, 13])
        assert empty == b""
