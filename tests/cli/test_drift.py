"""detlogp drift: the DriftDetail statistics against numpy, the verdict and exit code per dtype
table, masks, non-finite values, and logprob outputs as inputs."""

import json

import numpy as np
import pytest

from cli_helpers import read_safetensors, run_cli, write_safetensors

N = 200


def files(d, cand, ref, mask=None):
    np.save(d / "cand.npy", cand.astype(np.float32))
    np.save(d / "ref.npy", ref.astype(np.float32))
    args = ["drift", "--candidate", "cand.npy", "--reference", "ref.npy"]
    if mask is not None:
        np.save(d / "mask.npy", mask)
        args += ["--mask", "mask.npy"]
    return args


def expected(cand, ref, mask):
    c = cand.astype(np.float32).astype(np.float64)[mask]
    r = ref.astype(np.float32).astype(np.float64)[mask]
    d = c - r
    a = np.abs(d)
    worst = int(np.flatnonzero(mask)[np.argmax(a)])
    return dict(count=int(mask.sum()), max_abs=a.max(), mean_abs=a.mean(),
                p95_abs=np.quantile(a, 0.95), p99_abs=np.quantile(a, 0.99),
                max_rel=(a / np.maximum(np.abs(r), 1e-12)).max(), worst=worst,
                approx_kl0=np.mean(np.exp(d) - 1 - d),
                clipfrac0=np.mean((np.exp(d) < 0.8) | (np.exp(d) > 1.2)))


def test_statistics_and_pass(tmp_path):
    rng = np.random.default_rng(7)
    ref = rng.uniform(-12, 0, N)
    cand = ref + rng.normal(0, 0.01, N)
    mask = rng.uniform(size=N) > 0.2
    p = run_cli(*files(tmp_path, cand, ref, mask), "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    e = expected(cand, ref, mask)
    assert r["passed"] is True and r["failures"] == []
    assert r["count"] == e["count"] and r["tokens"] == N
    for k in ("max_abs", "mean_abs", "p95_abs", "p99_abs", "max_rel", "approx_kl0", "clipfrac0"):
        assert r[k] == pytest.approx(e[k], rel=1e-9, abs=1e-15), k
    assert r["worst"]["index"] == e["worst"]
    assert r["worst"]["candidate"] == pytest.approx(float(np.float32(cand[e["worst"]])))
    assert r["worst"]["reference"] == pytest.approx(float(np.float32(ref[e["worst"]])))
    assert r["thresholds"]["max_abs"] == 6e-2 and r["thresholds"]["approx_kl0"] == 5e-2


@pytest.mark.parametrize("dtype,delta,passes", [
    ("bf16", 0.05, True), ("bf16", 0.07, False),
    ("fp16", 0.004, True), ("fp16", 0.006, False),
    ("fp32", 5e-6, True), ("fp32", 2e-5, False)])
def test_verdict_per_dtype(tmp_path, dtype, delta, passes):
    ref = np.full(N, -3.0)
    cand = ref.copy()
    cand[17] += delta
    p = run_cli(*files(tmp_path, cand, ref), "--dtype", dtype, "--json", cwd=tmp_path)
    r = json.loads(p.stdout)
    assert p.returncode == (0 if passes else 1), p.stdout
    assert r["passed"] is passes
    if not passes:
        assert any("max_abs" in f for f in r["failures"])


def test_clipfrac_fails_and_mask_excludes(tmp_path):
    ref = np.full(N, -2.0)
    cand = ref.copy()
    cand[5] += 0.5  # exp(0.5) = 1.65 is outside [0.8, 1.2]
    p = run_cli(*files(tmp_path, cand, ref), "--json", cwd=tmp_path)
    r = json.loads(p.stdout)
    assert p.returncode == 1
    assert r["clipfrac0"] == pytest.approx(1 / N)
    assert any("clipfrac0" in f for f in r["failures"])
    mask = np.ones(N, dtype=np.uint8)
    mask[5] = 0
    p = run_cli(*files(tmp_path, cand, ref, mask), cwd=tmp_path)
    assert p.returncode == 0, p.stdout
    assert "verdict         PASS" in p.stdout


def test_non_finite_active_fails_inactive_ignored(tmp_path):
    ref = np.full(N, -1.0)
    cand = ref.copy()
    cand[9] = np.nan
    p = run_cli(*files(tmp_path, cand, ref), "--json", cwd=tmp_path)
    r = json.loads(p.stdout)
    assert p.returncode == 1 and r["non_finite"] == 1 and r["first_non_finite"] == 9
    mask = np.ones(N, dtype=bool)
    mask[9] = False
    assert run_cli(*files(tmp_path, cand, ref, mask), cwd=tmp_path).returncode == 0


def test_no_active_tokens_fails(tmp_path):
    ref = np.zeros(N)
    p = run_cli(*files(tmp_path, ref, ref, np.zeros(N, dtype=bool)), "--json", cwd=tmp_path)
    r = json.loads(p.stdout)
    assert p.returncode == 1 and r["count"] == 0 and r["worst"] is None
    assert r["failures"] == ["no active tokens"]


def test_logprob_outputs_compare_directly(tmp_path):
    """Two `detlogp logprob` outputs (several tensors each: drift reads 'logp')."""
    rng = np.random.default_rng(0)
    x = rng.normal(0, 2, size=(5, 640)).astype(np.float32)
    t = rng.integers(0, 640, 5).astype(np.int64)
    write_safetensors(tmp_path / "in.safetensors", {"logits": x, "targets": t})
    for name, extra in (("a", []), ("b", ["--tp", "4", "--tile-width", "32"])):
        p = run_cli("logprob", "--logits", "in.safetensors", "--targets", "in.safetensors",
                    "--entropy", *extra, "--out", f"{name}.safetensors", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
    # Tile width changes the canonical tree (so the bits may differ), never the accuracy class.
    p = run_cli("drift", "--candidate", "b.safetensors", "--reference", "a.safetensors",
                "--dtype", "fp32", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stdout
    r = json.loads(p.stdout)
    assert r["count"] == 5 and r["max_abs"] <= 1e-5
    out, _ = read_safetensors(tmp_path / "a.safetensors")
    assert len(out["logp"][1]) == 5
