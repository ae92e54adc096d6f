"""Overflow in the shard-bound helpers raises LogprobContractError (never negative bounds), and
TorchDistributedComm's timeout must be a positive number of seconds (what a timeout says:
test_transport_failures.py)."""

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
