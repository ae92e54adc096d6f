"""Two threads per rank scoring on one gloo TP group at the same time (a policy and a reference
model): the process never aborts inside gloo, and every call either returns what it returns
when the calls run one after another or raises a clear error; afterwards the group works.
Two spawned ranks (child processes: an abort fails the test instead of the test run), under
a timeout."""

import signal

import pytest

torch = pytest.importorskip("torch")

TIMEOUT_S = 240
CLEAR = ("overlapped on rank", "cross-rank preflight failed")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import concurrent_worker
    from spawn import run_workers

    out, codes = run_workers(concurrent_worker.main, tmp_path_factory.mktemp("concurrent"), 2,
                             TIMEOUT_S)
    assert -signal.SIGABRT not in codes, f"a rank aborted: exit codes {codes}"
    assert codes == [0, 0], codes
    return out


@pytest.mark.parametrize("scenario", ["different shapes", "same shapes"])
def test_concurrent_calls_are_right_or_refused(ranks, scenario):
    for rank, res in enumerate(ranks):
        got = res[scenario]
        for name, outcomes in got["outcomes"].items():
            assert len(outcomes) == 8
            for kind, value in outcomes:
                if kind == "ok":
                    assert torch.equal(value, got["expected"][name]), (rank, name)
                else:
                    assert any(phrase in value for phrase in CLEAR), (rank, name, value)
            assert torch.equal(got["after"][name], got["expected"][name]), (rank, name)


def test_an_overlap_names_the_cause_and_the_fix(ranks):
    messages = [value for res in ranks for got in (res["different shapes"], res["same shapes"])
                for outcomes in got["outcomes"].values() for kind, value in outcomes
                if kind == "error" and "overlapped" in value]
    for m in messages:
        assert "another thread started a call on the group while one was in flight" in m, m
        assert "give each thread its own group (torch.distributed.new_group)" in m, m
