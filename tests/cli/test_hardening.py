"""Nothing lost, nothing hung: the command line under failures. Outputs are all or nothing (a
failure writing --provenance leaves an older --out byte-identical), a 250-byte output name
works, work that does not fit in the memory available is refused up front with both numbers,
options that would overflow or exceed the in-process group's limit are refused, and under
mpiexec a bad option on one rank ends every rank. Every run has a timeout (a hang fails)."""

import os
import subprocess

import numpy as np
import pytest

from cli_helpers import BIN, MPIEXEC, write_safetensors

INT64_MAX = 2**63 - 1


def detlogp(*args, env=None, timeout=120, launcher=()):
    full_env = dict(os.environ)
    full_env.update(env or {})
    cmd = list(launcher) + [BIN] + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)


@pytest.fixture
def inputs(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 256)).astype(np.float32)
    write_safetensors(tmp_path / "logits.safetensors", {"logits": x})
    np.save(tmp_path / "targets.npy", rng.integers(0, 200, size=6).astype(np.int64))
    np.save(tmp_path / "g.npy", np.ones(6, dtype=np.float32))
    return tmp_path


def logprob(d, out, *extra, env=None):
    return detlogp("logprob", "--logits", d / "logits.safetensors", "--targets",
                   d / "targets.npy", "--real-vocab", 200, "--out", out, *extra, env=env)


@pytest.mark.parametrize("step", ["rename", "write"])
def test_provenance_failure_keeps_the_old_out_byte_identical(inputs, step):
    out, prov = inputs / "out.safetensors", inputs / "prov.json"
    assert logprob(inputs, out, "--provenance", prov).returncode == 0
    old_out, old_prov = out.read_bytes(), prov.read_bytes()
    before = sorted(os.listdir(inputs))
    # A different result (temperature 2), whose provenance cannot be written.
    p = logprob(inputs, out, "--provenance", prov, "--temperature", 2,
                env={"DETLOGP_TESTING_IO_FAIL": f"{step}:prov.json"})
    assert p.returncode == 2, p.stderr
    assert str(prov) in p.stderr
    assert ("disk full" if step == "write" else "cannot rename") in p.stderr
    assert out.read_bytes() == old_out
    assert prov.read_bytes() == old_prov
    assert sorted(os.listdir(inputs)) == before  # no temp or backup file left behind
    # Without the failure both files are replaced.
    assert logprob(inputs, out, "--provenance", prov, "--temperature", 2).returncode == 0
    assert out.read_bytes() != old_out


def test_failure_renaming_out_keeps_both_old_files(inputs):
    out, prov = inputs / "out.safetensors", inputs / "prov.json"
    assert logprob(inputs, out, "--provenance", prov).returncode == 0
    old = out.read_bytes(), prov.read_bytes()
    p = logprob(inputs, out, "--provenance", prov, "--temperature", 2,
                env={"DETLOGP_TESTING_IO_FAIL": "rename:out.safetensors"})
    assert p.returncode == 2 and str(out) in p.stderr, p.stderr
    assert (out.read_bytes(), prov.read_bytes()) == old


def test_250_byte_output_name(inputs):
    name = "o" * (250 - len(".safetensors")) + ".safetensors"
    assert len(name) == 250
    p = logprob(inputs, inputs / name, "--provenance", inputs / ("p" * 245 + ".json"))
    assert p.returncode == 0, p.stderr
    assert (inputs / name).stat().st_size > 0


def test_gradient_beyond_the_memory_limit_is_refused_up_front(inputs):
    # The logits (6144 bytes) fit under the limit, the logits and their gradient do not.
    limit = 6 * 256 * 4 + 100
    p = logprob(inputs, inputs / "out.safetensors", env={"DETLOGP_TESTING_MEMORY_LIMIT": str(limit)})
    assert p.returncode == 0, p.stderr
    p = logprob(inputs, inputs / "out2.safetensors", "--grad-logp", inputs / "g.npy",
                env={"DETLOGP_TESTING_MEMORY_LIMIT": str(limit)})
    assert p.returncode == 2, p.stderr
    assert "needs 12288 bytes" in p.stderr and f"has {limit} bytes available" in p.stderr
    assert "logits.safetensors" in p.stderr and "--grad-*" in p.stderr
    assert not (inputs / "out2.safetensors").exists()


def test_run_and_bench_refused_under_an_injected_limit():
    # 64 x 3072 bf16 logits and gradient: 786432 bytes.
    env = {"DETLOGP_TESTING_MEMORY_LIMIT": "100000"}
    p = detlogp("run", "--tokens", 64, "--real-vocab", 3000, "--tp", 1, env=env)
    assert p.returncode == 2, p.stderr
    assert "needs 786432 bytes" in p.stderr
    assert "has 100000 bytes available (DETLOGP_TESTING_MEMORY_LIMIT)" in p.stderr
    assert "use fewer --tokens" in p.stderr
    p = detlogp("bench", "--tokens", 64, "--real-vocab", 3000, env=env)
    assert p.returncode == 2, p.stderr
    assert "use fewer --tokens" in p.stderr and "100000 bytes" in p.stderr


def limited_cgroup(limit):
    """(directory, file to write a pid to, expected source text) of a fresh child memory cgroup
    with `limit`, v2 or v1, or None when no memory cgroup is writable here."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [ln.strip().split(":", 2) for ln in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        if controllers == "":
            base = next((b for b in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
                         if os.path.exists(os.path.join(b, "cgroup.controllers"))), None)
            limit_file, version = "memory.max", "v2"
        elif "memory" in controllers.split(","):
            base, limit_file, version = "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "v1"
        else:
            continue
        if base is None:
            continue
        d = os.path.join(base + path, f"detlogp-test-{os.getpid()}")
        try:
            os.mkdir(d)
        except OSError:
            continue
        try:
            with open(os.path.join(d, limit_file), "w") as f:
                f.write(f"{limit}\n")
            with open(os.path.join(d, limit_file)) as f:
                actual = f.read().strip()
            return d, os.path.join(d, "cgroup.procs"), f"cgroup {version} {limit_file} {actual}"
        except OSError:
            os.rmdir(d)
    return None


def test_run_refused_under_a_real_cgroup_limit():
    cg = limited_cgroup(200_000_000)
    if cg is None:
        pytest.skip("no writable memory cgroup here (the injected limit covers the refusal)")
    d, procs, source = cg
    try:
        def enter():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        # 4096 x 151936 bf16 logits + gradient = 2.5 GB > 200 MB.
        p = subprocess.run([BIN, "run", "--tokens", "4096", "--tp", "1"], capture_output=True,
                           text=True, timeout=120, preexec_fn=enter)
        assert p.returncode == 2, p.stderr
        assert source in p.stderr, p.stderr
        assert "use fewer --tokens" in p.stderr
    finally:
        os.rmdir(d)


def test_sparse_file_claiming_a_terabyte_names_the_file(tmp_path):
    path = tmp_path / "huge.npy"
    np.save(path, np.zeros(1, dtype=np.float32))
    raw = path.read_bytes()
    header = raw[:-4].replace(b"(1,)", b"(250000000000,)")
    # Keep the header length: drop as many padding spaces as the shape grew.
    grow = len(b"(250000000000,)") - len(b"(1,)")
    nl = header.rindex(b"\n")
    header = header[:nl - grow] + header[nl:]
    path.write_bytes(header)
    try:
        os.truncate(path, len(header) + 250000000000 * 4)
    except OSError:
        pytest.skip("the file system refuses a 1 TB sparse file")
    np.save(tmp_path / "t.npy", np.zeros(1, dtype=np.int64))
    p = detlogp("logprob", "--logits", path, "--targets", tmp_path / "t.npy", "--out",
                tmp_path / "o.safetensors")
    assert p.returncode == 2, p.stderr
    assert str(path) in p.stderr and "needs 1000000000000 bytes" in p.stderr
    assert "bad_alloc" not in p.stderr


@pytest.mark.parametrize("command", ["run", "logprob"])
def test_tp_above_the_in_process_limit_is_refused(inputs, command):
    if command == "run":
        p = detlogp("run", "--tokens", 8, "--real-vocab", 3000, "--tp", 65)
    else:
        p = logprob(inputs, inputs / "o.safetensors", "--tp", 65)
    assert p.returncode == 2, p.stderr
    assert "must be in [1, 64]" in p.stderr and "square" in p.stderr


@pytest.mark.parametrize("args,phrase", [
    (["--tile-width", INT64_MAX], None),
    (["--real-vocab", INT64_MAX], "overflows"),
    (["--real-vocab", INT64_MAX - 100, "--tp", 2], "overflows"),
    (["--collective-timeout", -1], "--collective-timeout"),
    (["--collective-timeout", "inf"], "--collective-timeout"),
])
def test_extreme_run_options_are_clear_errors(args, phrase):
    p = detlogp("run", "--tokens", 4, *args)
    if phrase is None:  # a tile wider than the vocabulary: one tile, one rank is fine
        assert "0 tiles" not in p.stderr
        p = detlogp("run", "--tokens", 4, *args, "--tp", 2)
    assert p.returncode == 2, p.stderr
    assert "0 tiles" not in p.stderr
    if phrase:
        assert phrase in p.stderr


FUSED = ["--fused", "--hidden", 64]


@pytest.mark.parametrize("fused", [False, True], ids=["run", "run-fused"])
@pytest.mark.parametrize("args,phrase", [
    (["--temperature", 0], "--temperature"),
    (["--temperature", -1], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--temperature", "inf"], "--temperature"),
    (["--softcap", 0], "--softcap"),
    (["--softcap", -30], "--softcap"),
    (["--softcap", "nan"], "--softcap"),
    (["--softcap", "inf"], "--softcap"),
    (["--threads", -1], "--threads"),
    (["--tokens", 0], "--tokens"),
    (["--tokens", 2**62], "--tokens"),
    (["--real-vocab", INT64_MAX], "overflows"),
    (["--tile-width", 0], "--tile-width"),
    (["--tp", 65], "must be in [1, 64]"),
    (["--tp", "1,x"], "--tp"),
    (["--dtype", "fp8"], "fp8"),
    (["--device", "tpu"], "--device"),
    (["--collective-timeout", -1], "--collective-timeout"),
    (["--cp", 2], "--cp"),
])
def test_run_and_fused_refuse_bad_options_before_making_data(fused, args, phrase):
    # The same options get the same checks with and without --fused, all before any data is
    # made: stderr holds the one error line and no progress line.
    base = (FUSED if fused else []) + ["--tokens", 4, "--real-vocab", 3000, "--tp", "1,2"]
    p = detlogp("run", *base, *args, timeout=60)
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip()
    assert "\n" not in err, err
    assert phrase in err and "generating" not in err, err


@pytest.mark.parametrize("hidden", [INT64_MAX, 2**62, 2**40])
def test_fused_huge_hidden_is_refused_up_front(hidden):
    p = detlogp("run", "--fused", "--tokens", 4, "--real-vocab", 3000, "--tp", 1,
                "--hidden", hidden, timeout=60)
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip()
    assert "\n" not in err and "generating" not in err, err
    assert f"--hidden {hidden}" in err, err
    assert "vector" not in err and "bad_alloc" not in err


def test_fused_memory_estimate_is_checked_up_front():
    # hidden [4, 64] and lm_head [3072, 64] bf16 at TP 1 and 2: the weight and one weight
    # gradient per degree alone are 3 x 3072 x 64 x 2 bytes.
    args = ["run", "--fused", "--tokens", 4, "--hidden", 64, "--real-vocab", 3000, "--tp", "1,2",
            "--threads", 2]
    p = detlogp(*args, env={"DETLOGP_TESTING_MEMORY_LIMIT": "100000"}, timeout=60)
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip()
    assert "\n" not in err and "generating" not in err, err
    assert "has 100000 bytes available (DETLOGP_TESTING_MEMORY_LIMIT)" in err
    assert "use fewer --tokens" in err and "--hidden" in err
    needed = int(err.split(" needs ")[1].split(" bytes")[0])
    assert needed >= 3 * 3072 * 64 * 2
    p = detlogp(*args, env={"DETLOGP_TESTING_MEMORY_LIMIT": str(needed)}, timeout=120)
    assert p.returncode == 0, p.stderr


def test_fused_does_not_run_until_killed():
    # 2^62 tokens: refused (an overflow or the memory check), not run until the OOM killer.
    p = detlogp("run", "--fused", "--tokens", 2**62, "--tp", 1, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "--tokens" in p.stderr and "generating" not in p.stderr


pytestmark_mpi = pytest.mark.skipif(not MPIEXEC, reason="built without MPI")


@pytestmark_mpi
@pytest.mark.parametrize("bad", [["--tp", 3], ["--backend", "nope"], ["--tokens", 7]])
def test_mpi_bad_option_on_one_rank_ends_every_rank(bad):
    common = ["run", "--comm", "mpi", "--tokens", 16, "--real-vocab", 3000, "--threads", 1,
              "--collective-timeout", 20]
    cmd = MPIEXEC + ["--timeout", "60", "-n", "1", BIN] + [str(a) for a in common] + \
        [":", "-n", "1", BIN] + [str(a) for a in common + bad]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert p.returncode != 0
    assert "rank 1" in p.stderr, p.stderr
    assert "timed out" not in p.stderr  # refused by the agreement, not by a timeout
