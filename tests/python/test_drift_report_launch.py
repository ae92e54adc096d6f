"""python -m detlogp.drift_report against bad launches and hostile outputs: a link planted at
the temporary file's name, outputs that cannot be written, unknown backends, sizes that
overflow or do not fit in memory (all refused before the computation, exit 2, no file), ranks
launched with different options (every rank fails within the agreement, naming the option),
a world size that is not TP x CP (an environment error), and the process group destroyed when
init_process_group fails after making it. Every launch runs in child processes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import detlogp
from detlogp import LogprobContractError
from detlogp import drift_report as dr
from detlogp._atomic_file import AtomicOutputFile, sibling_name

SMALL = dict(real_vocab=13, padded_vocab=16, num_vocab_tiles=8, batch=1, seq=4, prompt_tokens=1,
             batch_key=7)
GUARD_S = 120  # a hang guard only: every case here ends in seconds


def small_args(**kw):
    opts = {**SMALL, **kw}
    return sum(([f"--{k.replace('_', '-')}", str(v)] for k, v in opts.items()), [])


def run_report(args):
    """One process of the report (a world of one, torchrun's environment)."""
    env = dr._package_env({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(dr._free_port())})
    return subprocess.run([sys.executable, "-m", "detlogp.drift_report"] + args,
                          capture_output=True, text=True, timeout=GUARD_S, env=env)


def run_ranks(per_rank_args):
    """One process per rank, each with its own argv; returns [(exit code, stderr)]."""
    port, world = dr._free_port(), len(per_rank_args)
    procs = []
    for r, args in enumerate(per_rank_args):
        env = dr._package_env({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                               "MASTER_PORT": str(port)})
        procs.append(subprocess.Popen([sys.executable, "-m", "detlogp.drift_report"] + args,
                                      env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    out = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=GUARD_S)
            out.append((p.returncode, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def one_line_error(proc):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("detlogp.drift_report: error: "), proc.stderr
    return lines[0]


@pytest.fixture
def report_main(tmp_path, monkeypatch, capsys):
    """main() in this process as a world of one (a file rendezvous): (exit code, stderr)."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    rendezvous = tmp_path / "rendezvous"
    rendezvous.mkdir()

    def run(args, extra_env=None):
        import torch.distributed as dist

        for k, v in (extra_env or {}).items():
            monkeypatch.setenv(k, v)
        capsys.readouterr()
        init = f"file://{rendezvous}/{len(os.listdir(rendezvous))}"
        try:
            code = dr.main(args + ["--init-method", init])
        except SystemExit as e:  # argparse
            code = e.code
        assert not dist.is_initialized()  # destroyed on every path
        return subprocess.CompletedProcess(args, code, "", capsys.readouterr().err)

    return run


# --- the atomic writer --------------------------------------------------------------------------


def test_a_link_planted_at_every_predictable_name_is_left_alone(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "report.json"
    # Every name the old writer (and an obvious guess) would use: <out>.tmp<pid>, for the pids
    # the child can get, and the writer's own pattern with a guessed suffix.
    for pid in range(os.getpid(), os.getpid() + 2000):
        os.symlink(victim, f"{out}.tmp{pid}")
    os.symlink(victim, tmp_path / ".report.json.tmp-0000000000000000")
    proc = run_report(small_args() + ["--output", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "precious\n"
    assert json.loads(out.read_text())["passed"] is True
    planted = {p for p in os.listdir(tmp_path) if os.path.islink(tmp_path / p)}
    assert set(os.listdir(tmp_path)) - planted == {"victim.txt", "report.json"}  # no leftovers


def test_the_writer_follows_no_link_planted_at_its_old_temporary_name(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "report.json"
    os.symlink(victim, f"{out}.tmp{os.getpid()}")  # the name the report used to write
    dr._write_json({"passed": True}, str(out))
    assert victim.read_text() == "precious\n"
    assert json.loads(out.read_text()) == {"passed": True}


def test_a_link_at_the_output_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "report.json"
    os.symlink(victim, out)
    with AtomicOutputFile(str(out)) as f:
        f.write(b"{}\n")
        f.commit()
    assert victim.read_text() == "precious\n"
    assert not out.is_symlink() and out.read_text() == "{}\n"


def test_temporary_names_are_unpredictable_and_fit_name_max(tmp_path):
    a, b = sibling_name(str(tmp_path / "r.json"), ".tmp-"), sibling_name(str(tmp_path / "r.json"),
                                                                         ".tmp-")
    assert a != b and os.path.basename(a).startswith(".r.json.tmp-")
    long = str(tmp_path / ("x" * 255))
    name = os.path.basename(sibling_name(long, ".tmp-"))
    assert len(name) <= 255 and "~" in name
    with AtomicOutputFile(long) as f:
        f.write(b"ok")
        f.commit()
    assert open(long).read() == "ok"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    out.write_text("old\n")
    monkeypatch.setenv("DETLOGP_TESTING_IO_FAIL", "write:r.json")
    with pytest.raises(RuntimeError, match="r.json: disk full while writing"):
        with AtomicOutputFile(str(out)) as f:
            f.write(b"new\n")
    monkeypatch.setenv("DETLOGP_TESTING_IO_FAIL", "rename:r.json")
    with pytest.raises(RuntimeError, match="cannot rename the temporary file into place"):
        with AtomicOutputFile(str(out)) as f:
            f.write(b"new\n")
            f.commit()
    assert out.read_text() == "old\n" and os.listdir(tmp_path) == ["r.json"]


def test_writer_errors_name_the_path_and_the_kind(tmp_path):
    with pytest.raises(LogprobContractError, match="directory .* does not exist"):
        AtomicOutputFile(str(tmp_path / "missing" / "r.json"))
    with pytest.raises(LogprobContractError, match="is an existing directory"):
        AtomicOutputFile(str(tmp_path))
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        with pytest.raises(RuntimeError, match="cannot create a temporary file"):
            AtomicOutputFile(str(ro / "r.json"))


# --- up-front refusals -------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["missing", "directory", "read-only"])
def test_an_output_that_cannot_be_written_is_refused_up_front(tmp_path, where, report_main):
    if where == "missing":
        out = tmp_path / "missing" / "r.json"
        expect = "does not exist"
    elif where == "directory":
        out = tmp_path / "adir"
        out.mkdir()
        expect = "is an existing directory"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        out = ro / "r.json"
        expect = "cannot create a temporary file"
    line = one_line_error(report_main(small_args() + ["--output", str(out)]))
    assert expect in line and str(out) in line
    # No temporary file left anywhere (the old writer left adir.tmp<pid> next to the output).
    expected = {"directory": {"adir"}, "read-only": {"ro"}}.get(where, set()) | {"rendezvous"}
    assert set(os.listdir(tmp_path)) == expected
    if where != "missing":
        assert os.listdir(out if where == "directory" else out.parent) == []


def test_the_output_is_checked_before_the_computation(tmp_path, report_main, monkeypatch):
    ran = []
    monkeypatch.setattr(dr, "_inputs", lambda case: ran.append(case))
    one_line_error(report_main(small_args() + ["--output", str(tmp_path / "no" / "r.json")]))
    assert ran == []  # refused before any logits were generated


def test_an_unknown_backend_is_refused_up_front(tmp_path, report_main):
    out = tmp_path / "r.json"
    line = one_line_error(report_main(small_args(backend="nope") + ["--output", str(out)]))
    assert "requested_backend=nope" in line
    assert not out.exists()


def test_sizes_that_overflow_are_refused_up_front(tmp_path, report_main):
    out = tmp_path / "r.json"
    line = one_line_error(report_main(small_args(seq=10**20) + ["--output", str(out)]))
    assert "seq=100000000000000000000 does not fit in a 64-bit integer" in line
    line = one_line_error(report_main(small_args(seq=2**62) + ["--output", str(out)]))
    assert "overflows 64-bit sizes" in line
    assert not out.exists()


def test_a_case_that_does_not_fit_in_memory_is_refused_up_front(tmp_path, report_main):
    out = tmp_path / "r.json"
    # The memory rule of the command line's up-front checks, its testing hook included.
    line = one_line_error(report_main(small_args() + ["--output", str(out)],
                                      {"DETLOGP_TESTING_MEMORY_LIMIT": "1000"}))
    need = dr._memory_needed(dr.DriftCase(tp=1, cp=1, **SMALL), 0)
    assert f"needs {need} bytes but this process has 1000 bytes available" in line
    assert "(DETLOGP_TESTING_MEMORY_LIMIT); use fewer tokens (--batch, --seq)" in line
    assert not out.exists()


@pytest.mark.parametrize("args, expect", [
    (["--seq", "1e20"], "argument --seq: invalid int value: '1e20' (see python -m"),
    (small_args(logit_scale="inf"), "logit_scale must be finite and > 0; got inf"),
    (small_args(batch_key=2**64), "batch_key must be an integer in [-2^63, 2^64)"),
    (small_args() + ["--perturb-rank", "0", "--perturb-delta", "nan"],
     "the perturbation delta must be finite; got nan"),
])
def test_bad_options_are_one_line_errors(tmp_path, report_main, args, expect):
    # Each of these used to end in a traceback, some after the whole computation.
    out = tmp_path / "r.json"
    line = one_line_error(report_main(args + ["--output", str(out)]))
    assert expect in line
    assert not out.exists()


def test_the_memory_estimate_counts_the_logits_and_the_float64_oracle():
    case = dr.DriftCase(tp=1, cp=1, batch=1, seq=20000)  # OOM-killed after 40 s before
    logits = 20000 * 151936 * 4
    shard = 20000 * 151936 * (4 + 2)  # its copy and the bf16 cast
    oracle = 3 * 20000 * 151936 * 8
    assert dr._memory_needed(case, 0) == logits + shard + oracle
    assert dr._memory_needed(case, 0) > 80e9  # refused up front on any ordinary machine


def test_every_local_rank_counts_against_the_machine(monkeypatch):
    case = dr.DriftCase(tp=2, cp=2, **SMALL)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert list(dr._local_ranks(1, 4)) == [0, 1, 2, 3]
    monkeypatch.setenv("DETLOGP_TESTING_MEMORY_LIMIT",
                       str(sum(dr._memory_needed(case, r) for r in range(4)) - 1))
    with pytest.raises(RuntimeError, match="4 ranks on this machine"):
        dr._check_memory(case, 1, 4)
    monkeypatch.setenv("DETLOGP_TESTING_MEMORY_LIMIT",
                       str(sum(dr._memory_needed(case, r) for r in range(4))))
    dr._check_memory(case, 1, 4)


# --- ranks that disagree -----------------------------------------------------------------------


def test_ranks_launched_with_different_tp_cp_fail_together_naming_the_option():
    # Both launches are worlds of two (2 x 1 and 1 x 2): without the agreement, one rank waited
    # in new_group and the other died minutes later in a gloo collective.
    results = run_ranks([small_args() + ["--tp", "2", "--cp", "1"],
                         small_args() + ["--tp", "1", "--cp", "2"]])
    for code, err in results:
        assert code == 2, err
        assert "the ranks disagree on their options: rank 0 has --tp 2 but rank 1 has --tp 1" \
            in err, err


def test_ranks_launched_with_a_different_option_fail_together_naming_it():
    results = run_ranks([small_args() + ["--tp", "2"], small_args(batch_key=8) + ["--tp", "2"]])
    for code, err in results:
        assert code == 2, err
        assert "rank 0 has --batch-key 7 but rank 1 has --batch-key 8" in err, err


def test_one_rank_failing_its_preflight_fails_every_rank(tmp_path):
    # Only rank 0 writes, so only rank 0 finds that its output cannot be written.
    out = tmp_path / "missing" / "r.json"
    results = run_ranks([small_args() + ["--tp", "2", "--output", str(out)]] * 2)
    for code, err in results:
        assert code == 2, err
        assert "does not exist" in err, err


def test_spawn_local_stops_the_others_when_a_rank_fails_before_the_group(tmp_path, monkeypatch):
    # An unparsable perturbation in rank 1's environment only: rank 1 fails before any process
    # group exists, rank 0 waits in the rendezvous for it; the launcher stops rank 0.
    package_env = dr._package_env

    def env_of(extra=None):
        env = package_env(extra)
        if (extra or {}).get("RANK") == "1":
            env[dr.PERTURB_ENV] = "oops"
        return env

    monkeypatch.setattr(dr, "_package_env", env_of)
    code, errs = dr.spawn_local(dr.DriftCase(tp=2, cp=1, **SMALL), tmp_path / "r.json",
                                timeout_s=GUARD_S)
    assert code == 2, errs
    assert "RANK:DELTA" in errs[1], errs
    assert errs[0].endswith("stopped by the launcher: another rank failed"), errs
    assert os.listdir(tmp_path) == []


# --- the environment -----------------------------------------------------------------------------


def test_a_world_size_that_is_not_tp_times_cp_is_an_environment_error(tmp_path, report_main):
    line = one_line_error(report_main(small_args(tp=2) + ["--output", str(tmp_path / "r.json")]))
    assert "WORLD_SIZE=1 does not match TP*CP=2*1=2; launch 2 processes" in line
    out = _run_topology_in_child("import os; os.environ.update(RANK='0', WORLD_SIZE='2')\n")
    assert "raised: RuntimeError False " in out, out
    assert "initialized after: False" in out, out


def _run_topology_in_child(setup, call="dr.run_topology(case)"):
    """A fresh interpreter runs ``setup``, then ``call`` on the small case, and prints what it
    raised ("raised: <type> <is a ValueError> <message>") and whether a process group is left
    ("initialized after: <bool>"). Returns its stdout and stderr."""
    code = (setup + "import torch.distributed as dist\n"
            "from detlogp import drift_report as dr\n"
            f"case = dr.DriftCase(tp=1, cp=1, **{SMALL!r})\n"
            "try:\n"
            f"    {call}\n"
            "except Exception as e:\n"
            "    print('raised:', type(e).__name__, isinstance(e, ValueError), e)\n"
            "print('initialized after:', dist.is_initialized())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=GUARD_S, env=dr._package_env())
    return out.stdout + out.stderr


def test_the_group_is_destroyed_when_init_fails_after_making_it(tmp_path):
    # init_process_group makes the default group, then waits in a store barrier for every
    # rank; that barrier failing (a peer that died, a timeout) leaves the group behind. Since
    # torch 2.1 the barrier runs only with TORCH_DIST_INIT_BARRIER=1 (which users set).
    out = _run_topology_in_child(
        "import os; os.environ['TORCH_DIST_INIT_BARRIER'] = '1'\n"
        "import torch.distributed as dist, torch.distributed.distributed_c10d as c10d\n"
        "def barrier(*a, **k):\n"
        "    assert dist.is_initialized()  # the group exists by now\n"
        "    raise RuntimeError('store barrier timed out')\n"
        "c10d._store_based_barrier = barrier\n",
        f"dr.run_topology(case, None, 'file://{tmp_path}/rendezvous')")
    assert "raised: RuntimeError False store barrier timed out" in out, out
    assert "initialized after: False" in out, out


def test_an_existing_default_group_is_refused_and_left_alone(tmp_path):
    out = _run_topology_in_child(
        "import torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path}/rv', rank=0,"
        " world_size=1)\n")
    assert "raised: RuntimeError False a default process group already exists" in out, out
    assert "initialized after: True" in out, out


# --- detlogp.drift's mask ------------------------------------------------------------------------


def test_drift_accepts_the_masks_the_torch_api_accepts():
    cand = torch.tensor([-1.0, -2.0, -3.5, -0.5])
    ref = torch.tensor([-1.0, -2.5, -3.0, -0.5])
    expect = detlogp.drift(cand, ref, mask=torch.tensor([False, True, True, False]), dtype="fp32")
    # verl's response_mask is float; int, NumPy and lists read the same way: nonzero = scored.
    for mask in (torch.tensor([0.0, 1.0, 1.0, 0.0]), torch.tensor([0, 1, 1, 0]),
                 torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=torch.bfloat16),
                 np.array([0.0, 1.0, 2.0, 0.0]), [0.0, 1.0, 1.0, 0.0], [0, 1, 1, 0]):
        got = detlogp.drift(cand, ref, mask=mask, dtype="fp32")
        assert got == expect, mask
    with pytest.raises(LogprobContractError, match="mask must hold bools, integers or floats"):
        detlogp.drift(cand, ref, mask=torch.zeros(4, dtype=torch.complex64))
    with pytest.raises(LogprobContractError, match="mask must have one entry per token"):
        detlogp.drift(cand, ref, mask=[1.0, 0.0])


def test_drift_and_the_torch_api_read_a_float_mask_alike():
    from detlogp.torch import vocab_parallel_logprobs

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 32, generator=g)
    targets = torch.randint(0, 32, (2, 5), generator=g)
    response_mask = torch.zeros(2, 5)
    response_mask[:, 2:] = 1
    logp = vocab_parallel_logprobs(logits, targets, loss_mask=response_mask)
    ref = torch.log_softmax(logits.double(), -1).gather(-1, targets[..., None])[..., 0]
    d = detlogp.drift(logp.reshape(-1), ref.reshape(-1), mask=response_mask.reshape(-1),
                      dtype="fp32")
    assert d["count"] == 6 and d["passed"], d
    assert torch.all(logp[response_mask == 0] == 0)
