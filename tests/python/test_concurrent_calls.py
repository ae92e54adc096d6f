"""Two threads per rank scoring on one gloo TP group at the same time (a policy and a reference
model): the process never aborts inside gloo, and every call either returns what it returns
when the calls run one after another or raises a clear error; afterwards the group works.
Two spawned ranks (child processes: an abort fails the test instead of the test run), under
a timeout."""

import os
import pathlib
import signal

import pytest

torch = pytest.importorskip("torch")

HERE = pathlib.Path(__file__).parent
TIMEOUT_S = 240
CLEAR = ("overlapped on rank", "cross-rank preflight failed")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import torch.multiprocessing as mp

    import concurrent_worker

    tmp = tmp_path_factory.mktemp("concurrent")
    ctx = mp.get_context("spawn")
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        procs = [ctx.Process(target=concurrent_worker.main,
                             args=(r, 2, str(tmp / "rendezvous"), str(tmp), str(HERE)))
                 for r in range(2)]
        for p in procs:
            p.start()
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    for p in procs:
        p.join(TIMEOUT_S)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    assert not hung, f"ranks {hung} did not finish within {TIMEOUT_S} s (hang)"
    codes = [p.exitcode for p in procs]
    assert -signal.SIGABRT not in codes, f"a rank aborted: exit codes {codes}"
    assert codes == [0, 0], codes
    out = []
    for r in range(2):
        res = torch.load(tmp / f"rank{r}.pt")
        assert "crash" not in res, f"rank {r} crashed:\n{res['crash']}"
        out.append(res)
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
