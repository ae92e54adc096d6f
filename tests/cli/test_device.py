"""--device cpu|cuda of run, logprob and bench (docs/cli.md). Without a CUDA device (CI) or
without the CUDA backend, --device cuda is a usage error: exit 2, one line on stderr, nothing
written. Where a device exists the same commands must succeed (that is checked for real by
scripts/gpu-check.sh on a GPU machine)."""

import json
import re

import numpy as np
import pytest

from cli_helpers import run_cli

NO_CUDA = re.compile(r"^detlogp (run|logprob|bench): error: --device cuda: "
                     r"(no CUDA device \(.+\)|this detlogp was built without CUDA .+)\n$")


@pytest.fixture()
def files(tmp_path):
    rng = np.random.default_rng(3)
    np.save(tmp_path / "logits.npy", rng.normal(0, 2, size=(4, 256)).astype(np.float32))
    np.save(tmp_path / "targets.npy", rng.integers(0, 256, 4).astype(np.int64))
    np.save(tmp_path / "g.npy", np.ones(4, np.float32))
    return tmp_path


COMMANDS = {
    "run": ["run", "--device", "cuda", "--tokens", 8, "--real-vocab", 300, "--threads", 2],
    "logprob": ["logprob", "--device", "cuda", "--logits", "logits.npy", "--targets",
                "targets.npy", "--grad-logp", "g.npy", "--out", "out.safetensors"],
    "bench": ["bench", "--device", "cuda", "--tokens", 4, "--real-vocab", 300, "--repeats", 1],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_device_cuda_exits_2_with_one_line_or_runs(files, command):
    p = run_cli(*COMMANDS[command], cwd=files)
    if p.returncode == 0:  # a CUDA device and a CUDA build: it ran
        if command == "run":
            assert "result: PASS" in p.stdout
        return
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert NO_CUDA.match(p.stderr), p.stderr
    assert p.stdout == ""
    assert not (files / "out.safetensors").exists()


def test_device_must_be_cpu_or_cuda(files):
    for command in ("run", "logprob", "bench"):
        args = [a if a != "cuda" else "gpu" for a in COMMANDS[command]]
        p = run_cli(*args, cwd=files)
        assert p.returncode == 2
        assert p.stderr == f"detlogp {command}: error: --device must be cpu or cuda; got 'gpu'\n"


def test_device_cuda_does_not_combine_with_mpi():
    p = run_cli("run", "--device", "cuda", "--comm", "mpi", "--tokens", 8)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1
    assert "--device cuda" in p.stderr and "--comm mpi" in p.stderr


def test_device_cpu_is_the_default(files):
    a = run_cli("run", "--tokens", 8, "--real-vocab", 300, "--tp", "1,2", "--threads", 2,
                "--json")
    b = run_cli("run", "--device", "cpu", "--tokens", 8, "--real-vocab", 300, "--tp", "1,2",
                "--threads", 2, "--json")
    assert a.returncode == b.returncode == 0, (a.stderr, b.stderr)
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    assert "device" not in ja and "device" not in jb
    assert ja["digests"] == jb["digests"]
    p = run_cli("logprob", "--device", "cpu", "--logits", "logits.npy", "--targets",
                "targets.npy", "--out", "out.safetensors", cwd=files)
    assert p.returncode == 0, p.stderr
    p = run_cli("bench", "--device", "cpu", "--tokens", 4, "--real-vocab", 300, "--repeats", 1,
                "--json")
    assert p.returncode == 0, p.stderr
    assert "read_gbps" in json.loads(p.stdout)["machine"]
