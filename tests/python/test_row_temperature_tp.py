"""Per-token temperatures at TP=2 over gloo (spawned ranks): ranks that hold the same logical
logits in different memory layouts get the TP=1 bits (the temperatures follow their tokens
when a rank reads its rows again in token order); ranks that pass different temperatures fail
together naming the temperature, and the group works afterwards."""

import pytest

from helpers import assert_bitwise
from spawn import run_workers

TIMEOUT_S = 240


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import row_temperature_worker

    return run_workers(row_temperature_worker.main, tmp_path_factory.mktemp("rowtemp"), 2,
                       TIMEOUT_S, pass_world=False)[0]


def test_mixed_layouts_give_the_tp1_bits(ranks):
    for rank, res in enumerate(ranks):
        for case in ("mixed layouts", "after"):
            got, ref = res[case], res["reference"]
            assert "error" not in got, (rank, case, got.get("error"))
            assert_bitwise(got["logp"], ref["logp"], f"{case} logp rank {rank}")
            assert_bitwise(got["entropy"], ref["entropy"], f"{case} entropy rank {rank}")
            assert_bitwise(got["grad"], ref["grad"], f"{case} grad rank {rank}")


def test_different_temperatures_fail_on_every_rank(ranks):
    for res in ranks:
        got = res["different temperatures"]
        assert "per-row temperatures" in got.get("error", ""), got
        assert got["field"] == "temperature"
