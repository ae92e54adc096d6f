"""The package itself: importable from the build tree under /usr/bin/python3, installable
into a prefix with `cmake --install --component python`, and its public names."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import detlogp


def test_built_for_this_interpreter():
    ext = pathlib.Path(detlogp._detlogp.__file__)
    assert ext.parent == pathlib.Path(detlogp.__file__).parent
    assert f"cpython-{sys.version_info.major}{sys.version_info.minor}" in ext.name
    assert detlogp.NUMERICS_VERSION.startswith("detlogp-canon-")
    for name in detlogp.__all__:
        assert hasattr(detlogp, name), name


def test_numpy_the_bindings_cannot_read_is_refused_at_import():
    # pybind11 before 2.12 builds NumPy arrays with NumPy 1's descriptor layout: under NumPy 2
    # every array the extension returns reads each element as the first one, silently (seen
    # with Debian's pybind11 2.10 and numpy 2.4 from PyPI). The import must refuse that pair.
    assert tuple(detlogp._detlogp.pybind11_version) >= (2, 10)
    code = ("import numpy; numpy.__version__ = '2.0.0'\n"
            "try:\n    import detlogp\nexcept ImportError as e:\n    print('refused:', e)\n"
            "else:\n    print('imported')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    if tuple(detlogp._detlogp.pybind11_version) >= (2, 12):
        assert p.stdout.strip() == "imported"
    else:
        assert p.stdout.startswith("refused:"), p.stdout
        assert "NumPy 2" in p.stdout and "numpy<2" in p.stdout and "2.0.0" in p.stdout


def test_install_into_a_prefix(tmp_path):
    build = os.environ.get("DETLOGP_BUILD_DIR")
    site_dir = os.environ.get("DETLOGP_PYTHON_INSTALL_DIR")  # relative to the prefix
    cmake = shutil.which("cmake")
    if not build or not site_dir or not cmake:
        pytest.skip("DETLOGP_BUILD_DIR, DETLOGP_PYTHON_INSTALL_DIR (set by ctest) and cmake "
                    "are needed")
    prefix = tmp_path / "prefix"
    subprocess.run([cmake, "--install", build, "--prefix", str(prefix), "--component",
                    "python"], check=True, capture_output=True, timeout=120)
    site = prefix / site_dir
    assert (site / "detlogp" / "__init__.py").exists()
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run(
        [sys.executable, "-c", "import detlogp; print(detlogp.__file__); "
         "c = detlogp.LogprobContract(role='train', dtype='fp32', "
         "mask=detlogp.MaskSpec.all_active(2), sharding=detlogp.ShardingSpec(tp_rank=0, "
         "tp_world_size=1, vocab_shard_bounds=[(0, 8)], real_vocab_size=8, "
         "padded_vocab_size=8)); print(detlogp.get_logprob_op(c).actual_backend)"],
        env=env, cwd=tmp_path, check=True, capture_output=True, text=True, timeout=60)
    lines = out.stdout.split()
    assert lines[0].startswith(str(site))
    assert lines[1] == detlogp.CPU_CANONICAL_BACKEND_ID


def test_callback_communicator_moves_bytes_and_reports_python_errors():
    import torch

    from helpers import contract

    def loopback(send):  # a fake 2-rank group whose ranks send the same bytes
        return send * 2

    comm = detlogp._detlogp.CallbackComm(1, 2, "loop", loopback, lambda: None)
    assert (comm.rank, comm.size, comm.name) == (1, 2, "loop")
    assert comm.all_gather(b"ab") == b"abab"

    def boom(send):
        raise ValueError("boom")

    bad = detlogp._detlogp.CallbackComm(0, 2, "test", boom, lambda: None)
    with pytest.raises(RuntimeError, match="test all_gather failed on rank 0: .*boom"):
        bad.all_gather(b"ab")
    short = detlogp._detlogp.CallbackComm(0, 2, "test", lambda send: send, lambda: None)
    with pytest.raises(RuntimeError, match=r"returned 2 bytes, expected 4 \(2 ranks x 2\)"):
        short.all_gather(b"ab")
    text = detlogp._detlogp.CallbackComm(0, 2, "test", lambda send: "abab", lambda: None)
    with pytest.raises(RuntimeError, match="returned str, expected bytes"):
        text.all_gather(b"ab")
    # Through the operator: the preflight's all-gather fails cleanly (no crash, no hang).
    c = contract(4, 1000, 1024, bounds=[(0, 512), (512, 1024)], tile_width=64)
    op, _ = detlogp.get_logprob_op(c)
    with pytest.raises(RuntimeError, match="boom"):
        op(torch.zeros(4, 512), torch.zeros(4, dtype=torch.int64), contract=c, group=bad)
    with pytest.raises(detlogp.LogprobContractError, match="rank=2 and size=2"):
        detlogp._detlogp.CallbackComm(2, 2, "x", loopback, lambda: None)
