"""Overflow in the shard-bound helpers raises LogprobContractError (never negative bounds), and
a torch.distributed rank that never calls forward makes its peer raise the timeout error of
TorchDistributedComm(timeout=...) instead of hanging."""

import pytest

import detlogp

INT64_MAX = 2**63 - 1


@pytest.mark.parametrize("call", [
    lambda: detlogp.megatron_bounds(INT64_MAX, 2),
    lambda: detlogp.megatron_bounds(INT64_MAX, 1),
    lambda: detlogp.megatron_padded_vocab(INT64_MAX - 5, 2),
    lambda: detlogp.megatron_padded_vocab(1, 2**62, 128),
])
def test_overflow_raises(call):
    with pytest.raises(detlogp.LogprobContractError, match="overflows"):
        call()


def test_bounds_near_int64_max_stay_a_partition():
    for tp in (1, 2, 3):
        bounds = detlogp.even_tile_aligned_bounds(INT64_MAX, tp, 128)
        assert bounds[0][0] == 0 and bounds[-1][1] == INT64_MAX
        assert all(b[1] > b[0] >= 0 for b in bounds)
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert detlogp.even_tile_aligned_bounds(151936, 1, INT64_MAX) == ((0, 151936),)
    padded, bounds = detlogp.megatron_bounds(INT64_MAX // 256 * 256 - 1000, 2)
    assert padded > 0 and all(b[1] > b[0] >= 0 for b in bounds)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "2"])
def test_torch_comm_timeout_must_be_positive_seconds(bad):
    with pytest.raises(detlogp.LogprobContractError, match="timeout"):
        detlogp.TorchDistributedComm(timeout=bad)


def test_rank_that_never_calls_forward_times_out_its_peer(tmp_path):
    torch = pytest.importorskip("torch")
    import lone_rank_worker
    from spawn import run_workers

    run_workers(lone_rank_worker.main, tmp_path, 2, 90, "sleeps", 2, pass_world=False,
                results=False)
    message = (tmp_path / "rank0.txt").read_text()
    print(message)
    assert message.startswith("RuntimeError"), message
    assert ("cross-rank preflight all-gather of the forward: torch.distributed:gloo all_gather "
            "timed out after 2 s on rank 0 of 2") in message
    seconds = float(message.split(" after ")[1].split(" s")[0])
    assert 1.5 <= seconds < 60
    del torch
