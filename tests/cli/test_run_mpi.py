"""detlogp run under mpiexec: rank 0 reports on the whole batch, and its digests equal the
in-process TP=1 digests for TP x CP = 2 x 1, 1 x 2, 2 x 2 and 4 x 1 (uneven token split)."""

import json

import pytest

from cli_helpers import MPIEXEC, run_cli, run_json

pytestmark = pytest.mark.skipif(not MPIEXEC, reason="built without MPI")

SMALL = ["--tokens", 41, "--real-vocab", 3000, "--threads", 4]


@pytest.fixture(scope="module")
def in_process():
    return run_json("run", *SMALL, "--tp", "1")["digests"]["1"]


def mpirun(np_, *args):
    launcher = MPIEXEC + ["--timeout", "240", "-n", str(np_)]
    return run_cli("run", "--comm", "mpi", *SMALL, *args, launcher=launcher, timeout=300)


@pytest.mark.parametrize("np_,tp,cp", [(2, None, None), (2, 1, 2), (4, 2, 2), (4, 4, 1)])
def test_mpi_digests_equal_in_process(in_process, np_, tp, cp):
    args = ["--json"]
    if tp is not None:
        args += ["--tp", tp, "--cp", cp]
    p = mpirun(np_, *args)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)  # one report, from rank 0 only
    tp = tp or np_
    assert r["comm"] == "mpi" and r["world_size"] == np_
    assert r["checks"]["passed"] is True
    assert r["runs"][0]["tp"] == tp and r["runs"][0]["cp"] == (cp or 1)
    assert r["runs"][0]["replicated"] and r["runs"][0]["padding_grad_zero"]
    assert r["digests"] == {str(tp): in_process}


def test_mpi_world_must_match_tp_times_cp():
    p = mpirun(2, "--tp", 4)
    assert p.returncode == 2
    assert "does not match TP*CP" in p.stderr
    assert p.stderr.count("does not match TP*CP") == 1  # reported once, by rank 0
