"""Any exception on one rank while a call prepares fails every rank of the group within
seconds, with one wording on every entry point ("rank R failed local validation: <type>:
<message>"): the fused lm_head (targets on `meta`, sparse targets, a bad thread count, with
and without autograd), detlogp.torch and the contract API. Two spawned gloo ranks, under a
timeout (a hang fails the test instead of blocking it)."""


import pytest

torch = pytest.importorskip("torch")

TIMEOUT_S = 150
FAIL_FAST_S = 20  # far below any collective timeout: nobody waited for a peer


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import fail_together_worker
    from spawn import run_workers

    return run_workers(fail_together_worker.main, tmp_path_factory.mktemp("fail_together"), 2,
                       TIMEOUT_S)[0]


SPARSE = "LogprobContractError: target_ids must be a strided (dense) tensor; got torch.sparse_coo"


@pytest.mark.parametrize("case,own", [
    ("fused meta targets", "NotImplementedError: "),
    ("fused sparse targets", SPARSE),
    ("fused threads=-1", "LogprobContractError: threads must be 0 (all hardware threads)"),
    ("fused grad, meta targets", "NotImplementedError: "),
    ("torch API meta targets", "NotImplementedError: "),
    ("op sparse targets", SPARSE),
])
def test_an_exception_on_one_rank_fails_the_other_fast(ranks, case, own):
    failing, peer = ranks[1][case], ranks[0][case]
    assert failing["message"].startswith(own), failing  # its own exception
    assert peer["seconds"] < FAIL_FAST_S, peer
    # The peer's message: the preflight's, then the failing rank's type and message as is.
    assert peer["message"] == ("LogprobContractError: cross-rank preflight failed: rank 1 "
                               "failed local validation: " + failing["message"]), peer


def test_the_group_still_works_after_the_failures(ranks):
    assert torch.equal(ranks[0]["fused after failures"], ranks[1]["fused after failures"])
