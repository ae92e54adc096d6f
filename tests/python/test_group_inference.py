"""Which group a call runs over, under torch.distributed with two ranks and no Megatron:
every entry point without ``group=`` raises, naming ``group=`` and the fix, before any number
exists and without a collective; a non-group says what ``group`` must be; a rank that passed
its group while its peer forgot ``group=`` fails within its collective timeout, saying a rank
did not arrive. (Megatron's TP group as the default when its parallel state is initialized:
test_peers.py, with the real Megatron.)"""


import pytest

from helpers import assert_bitwise
from spawn import run_workers

TIMEOUT_S = 180
ENTRIES = ["vocab_parallel_logprobs", "vocab_parallel_cross_entropy",
           "vocab_parallel_log_probs_from_logits", "vocab_parallel_entropy",
           "fused_linear_logprobs"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import group_worker

    return run_workers(group_worker.main, tmp_path_factory.mktemp("groups"), 2, TIMEOUT_S,
                       pass_world=False)[0]


@pytest.mark.parametrize("entry", ENTRIES)
def test_no_group_under_torch_distributed_raises_before_any_number(ranks, entry):
    for res in ranks:
        assert not res["megatron importable"]
        got = res[f"{entry} without group"]
        assert "value" not in got, got  # no number at all, right or wrong
        assert got["error"].startswith(f"LogprobContractError: {entry}: group= is missing: "
                                       "torch.distributed is initialized with 2 ranks"), got
        assert "Pass group=<the TP process group>" in got["error"]
        assert "group=detlogp.SelfComm()" in got["error"]
        assert got["seconds"] < 5  # raised here, no collective


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_non_group_says_what_group_must_be(ranks, entry):
    for res in ranks:
        got = res[f"{entry} group=2"]
        assert got["error"].startswith(
            f"LogprobContractError: {entry}: group must be a torch.distributed ProcessGroup "
            "(the TP group), a detlogp.Communicator"), got
        assert got["error"].endswith("got int 2")


def test_with_the_group_every_entry_point_agrees_across_ranks(ranks):
    for entry in ENTRIES:
        values = [res[f"{entry} with group"]["value"] for res in ranks]
        assert_bitwise(values[0], values[1], entry)
    assert_bitwise(ranks[0]["vocab_parallel_cross_entropy with group"]["value"],
                   -ranks[0]["vocab_parallel_logprobs with group"]["value"])


def test_whole_vocabulary_on_every_rank_needs_no_tp_group(ranks):
    for res in ranks:
        assert_bitwise(res["logprobs_from_logits"]["value"], res["self"]["value"])
        # TP=2 over the group gives the same bits as the whole vocabulary on one rank.
        assert_bitwise(res["vocab_parallel_logprobs with group"]["value"], res["self"]["value"])


def test_an_explicit_contract_needs_no_group(ranks):
    for res in ranks:
        assert_bitwise(res["fused contract"]["value"], res["fused self"]["value"])
        assert_bitwise(res["fused self"]["value"],
                       res["fused_linear_logprobs with group"]["value"])  # TP=2 = TP=1


def test_a_rank_without_group_does_not_hang_its_peer(ranks):
    forgot = ranks[1]["peer forgot group"]
    assert forgot["error"].startswith("LogprobContractError: vocab_parallel_logprobs: group= "
                                      "is missing"), forgot
    assert forgot["seconds"] < 5
    waited = ranks[0]["peer forgot group"]
    assert waited["error"].startswith("RuntimeError: "), waited
    assert "did not arrive" in waited["error"]
    assert 2.5 <= waited["seconds"] < 60, waited
