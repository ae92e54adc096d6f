"""`detlogp logprob` against the Python call on the same inputs: per-token temperatures
(`--row-temperature`, a tensor `temperature=`) and kept sets (`--kept-ids`, `kept_ids=`) give the
same bits (logp, entropy and the logits gradient), with and without a softcap, at TP 1 and 3 of
the command line."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from detlogp.torch import vocab_parallel_logprobs

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "cli"))
from cli_helpers import read_safetensors  # noqa: E402 (the command line tests' reader)

REAL, PADDED, W, ROWS = 1000, 1024, 64, 9


def cli_binary():
    build = os.environ.get("DETLOGP_BUILD_DIR")
    path = pathlib.Path(build) / "bin" / "detlogp" if build else None
    if path is None or not path.exists():
        pytest.skip("the detlogp command line is not built (DETLOGP_BUILD_TOOLS=OFF)")
    return path


def cli_outputs(tmp_path, x, t, option, softcap):
    """The CLI's outputs at TP 1 and 3 on logits `x` and targets `t`, with grad_logp 1 and
    grad_entropy 0.5, `option` (its flag and the .npy file it reads) and the cap: [(tp, {name:
    array})]."""
    np.save(tmp_path / "logits.npy", x.numpy())
    np.save(tmp_path / "targets.npy", t.numpy().astype(np.int64))
    np.save(tmp_path / "gl.npy", np.ones(ROWS, np.float32))
    np.save(tmp_path / "gh.npy", np.full(ROWS, 0.5, np.float32))
    cap = [] if softcap is None else ["--softcap", str(softcap)]
    runs = []
    for tp in (1, 3):
        out = tmp_path / f"out{tp}.safetensors"
        p = subprocess.run([str(cli_binary()), "logprob", "--logits", "logits.npy", "--targets",
                            "targets.npy", "--real-vocab", str(REAL), "--tile-width", str(W),
                            "--tp", str(tp), *option, "--entropy",
                            "--grad-logp", "gl.npy", "--grad-entropy", "gh.npy", *cap,
                            "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr
        runs.append((tp, {k: a for k, (_, a) in read_safetensors(out)[0].items()}))
    return runs


@pytest.mark.parametrize("softcap", [None, 8.0])
def test_cli_row_temperature_equals_python_call(tmp_path, softcap):
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(ROWS, PADDED, generator=gen) * 6
    x[:, REAL:] = 1e4  # padding: never read
    t = torch.randint(0, REAL, (ROWS,), generator=gen)
    temps = torch.tensor([0.7, 1.0, 1.9, 0.35, 1.0, 2.5, 0.7, 1.3, 0.9])
    xg = x.clone().requires_grad_(True)
    logp, ent = vocab_parallel_logprobs(xg, t, real_vocab=REAL, temperature=temps, entropy=True,
                                        tile_width=W, softcap=softcap)
    (logp.sum() + 0.5 * ent.sum()).backward()

    np.save(tmp_path / "rt.npy", temps.numpy())
    for tp, got in cli_outputs(tmp_path, x, t, ["--row-temperature", "rt.npy"], softcap):
        assert got["logp"].tobytes() == logp.detach().numpy().tobytes()
        assert got["entropy"].tobytes() == ent.detach().numpy().tobytes()
        g = got["grad_logits"]
        assert g[:, :REAL].tobytes() == xg.grad[:, :REAL].contiguous().numpy().tobytes()
        assert np.all(g[:, REAL:] == 0)


@pytest.mark.parametrize("softcap", [None, 8.0])
def test_cli_kept_ids_equal_python_call(tmp_path, softcap):
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(ROWS, PADDED, generator=gen) * 6
    x[:, REAL:] = 1e4  # padding: never read
    t = torch.randint(0, REAL, (ROWS,), generator=gen)
    kept = torch.full((ROWS, 40), -1, dtype=torch.int64)
    for r in range(ROWS):
        n = 1 + (r * 7) % 40
        ids = torch.randperm(REAL, generator=gen)[:n]
        if t[r] not in ids:
            ids[n // 2] = t[r]
        kept[r, :n] = ids  # in no order
    xg = x.clone().requires_grad_(True)
    logp, ent = vocab_parallel_logprobs(xg, t, real_vocab=REAL, entropy=True, tile_width=W,
                                        softcap=softcap, kept_ids=kept)
    (logp.sum() + 0.5 * ent.sum()).backward()

    np.save(tmp_path / "kept.npy", kept.numpy())
    for tp, got in cli_outputs(tmp_path, x, t, ["--kept-ids", "kept.npy"], softcap):
        assert got["logp"].tobytes() == logp.detach().numpy().tobytes()
        assert got["entropy"].tobytes() == ent.detach().numpy().tobytes()
        assert got["grad_logits"].tobytes() == xg.grad.contiguous().numpy().tobytes()
