"""detlogp logprob on small files: values against a float64 reference, bitwise equality across
--tp, every input format and dtype, provenance and metadata."""

import json
import os

import numpy as np
import pytest

from cli_helpers import (bf16_bits_to_f32, raw_tensor_bytes, read_safetensors, reference,
                         run_cli, to_bf16_bits, write_safetensors)

ROWS, PADDED, REAL = 7, 1024, 1000


@pytest.fixture()
def inputs(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(0.0, 2.0, size=(ROWS, PADDED)).astype(np.float32)
    for r in range(ROWS):
        x[r, rng.integers(0, REAL, size=3)] = rng.uniform(8, 20, size=3)
    x[:, REAL:] = 3e4  # padding: would dominate if it leaked
    t = rng.integers(0, REAL, size=ROWS).astype(np.int64)
    mask = np.ones(ROWS, dtype=bool)
    mask[[0, 4]] = False
    t[0] = -100
    t[4] = REAL + 7  # inactive: unconstrained
    gl = rng.uniform(-1, 1, ROWS).astype(np.float32)
    gL = rng.uniform(-0.3, 0.3, ROWS).astype(np.float32)
    gH = rng.uniform(-0.1, 0.1, ROWS).astype(np.float32)
    return dict(x=x, t=t, mask=mask, gl=gl, gL=gL, gH=gH, dir=tmp_path)


def save_npy(d, **arrays):
    for name, a in arrays.items():
        np.save(d / f"{name}.npy", a)


def test_fp32_npy_matches_float64_reference(inputs):
    d = inputs["dir"]
    save_npy(d, logits=inputs["x"], targets=inputs["t"], mask=inputs["mask"],
             gl=inputs["gl"], gL=inputs["gL"], gH=inputs["gH"])
    p = run_cli("logprob", "--logits", "logits.npy", "--targets", "targets.npy", "--mask",
                "mask.npy", "--real-vocab", REAL, "--entropy", "--grad-logp", "gl.npy",
                "--grad-lse", "gL.npy", "--grad-entropy", "gH.npy", "--out", "out.safetensors",
                cwd=d)
    assert p.returncode == 0, p.stderr
    out, meta = read_safetensors(d / "out.safetensors")
    assert sorted(out) == ["entropy", "grad_logits", "logp", "lse"]
    logp, lse, h, grad = reference(inputs["x"], inputs["t"], inputs["mask"], REAL,
                                   gl=inputs["gl"], gL=inputs["gL"], gH=inputs["gH"])
    assert out["logp"][0] == "F32" and out["grad_logits"][0] == "F32"
    np.testing.assert_allclose(out["logp"][1], logp, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out["lse"][1], lse, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out["entropy"][1], h, atol=1e-5, rtol=0)
    g = out["grad_logits"][1]
    assert g.shape == (ROWS, PADDED)
    np.testing.assert_allclose(g[:, :REAL], grad, atol=1e-5, rtol=0)
    assert np.all(g[:, REAL:] == 0)
    assert out["logp"][1][0] == 0 and out["logp"][1][4] == 0  # inactive tokens
    assert meta["real_vocab"] == str(REAL) and len(meta["contract_fingerprint"]) == 64


def test_softcap_matches_float64_reference_and_tp(inputs):
    d = inputs["dir"]
    save_npy(d, logits=inputs["x"], targets=inputs["t"], mask=inputs["mask"], gl=inputs["gl"])
    outs = []
    for tp in (1, 2, 4):
        p = run_cli("logprob", "--logits", "logits.npy", "--targets", "targets.npy", "--mask",
                    "mask.npy", "--real-vocab", REAL, "--tp", tp, "--softcap", 5,
                    "--temperature", 0.7, "--entropy", "--grad-logp", "gl.npy",
                    "--out", f"out{tp}.safetensors", cwd=d)
        assert p.returncode == 0, p.stderr
        outs.append(read_safetensors(d / f"out{tp}.safetensors"))
    out, meta = outs[0]
    assert meta["softcap"] == "5"
    for tp in (2, 4):
        for k in out:
            assert (raw_tensor_bytes(d / f"out{tp}.safetensors", k)
                    == raw_tensor_bytes(d / "out1.safetensors", k)), (tp, k)
    logp, lse, h, grad = reference(inputs["x"], inputs["t"], inputs["mask"], REAL,
                                   temperature=np.float32(0.7), gl=inputs["gl"], softcap=5.0)
    bound = 1e-5 + 6 * 2.0 ** -23 * 5 / 0.7 + 4e-6 * np.abs(lse).max()
    np.testing.assert_allclose(out["logp"][1], logp, atol=bound, rtol=0)
    np.testing.assert_allclose(out["lse"][1], lse, atol=bound, rtol=0)
    np.testing.assert_allclose(out["entropy"][1], h, atol=bound, rtol=0)
    np.testing.assert_allclose(out["grad_logits"][1][:, :REAL], grad, atol=1e-5 / 0.7, rtol=1e-5)
    # The cap changed the values: the uncapped LSE of these rows (logits up to 20) is far above.
    assert np.all(reference(inputs["x"], inputs["t"], inputs["mask"], REAL)[1] - lse > 5)


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_row_temperature_equals_scalar_calls_tp_and_reference(inputs, softcap):
    """--row-temperature: each token has the bits of the whole batch scored at its own scalar
    --temperature (logp, lse, entropy and its gradient row), at every --tp (uneven shards and
    padding), within the float64 reference's bound."""
    d = inputs["dir"]
    temps = np.array([0.7, 1.0, 1.9, 0.7, 0.35, 1.0, 3.0], np.float32)
    save_npy(d, logits=inputs["x"], targets=inputs["t"], mask=inputs["mask"], gl=inputs["gl"],
             gL=inputs["gL"], gH=inputs["gH"], rt=temps)
    cap = [] if softcap is None else ["--softcap", softcap]
    common = ["logprob", "--logits", "logits.npy", "--targets", "targets.npy", "--mask",
              "mask.npy", "--real-vocab", REAL, "--tile-width", 64, "--entropy", "--grad-logp",
              "gl.npy", "--grad-lse", "gL.npy", "--grad-entropy", "gH.npy", *cap]
    names = ("logp", "lse", "entropy", "grad_logits")
    for tp in (1, 3, 8):
        p = run_cli(*common, "--tp", tp, "--row-temperature", "rt.npy",
                    "--out", f"rt{tp}.safetensors", cwd=d)
        assert p.returncode == 0, p.stderr
    for tp in (3, 8):
        for k in names:
            assert (raw_tensor_bytes(d / f"rt{tp}.safetensors", k)
                    == raw_tensor_bytes(d / "rt1.safetensors", k)), (tp, k)
    # The temperatures as the tensor `row_temperature` of a file holding other inputs too.
    write_safetensors(d / "batch.safetensors", {"logits": inputs["x"], "row_temperature": temps})
    p = run_cli(*common, "--tp", 2, "--row-temperature", "batch.safetensors",
                "--out", "batch.out.safetensors", cwd=d)
    assert p.returncode == 0, p.stderr
    for k in names:
        assert (raw_tensor_bytes(d / "batch.out.safetensors", k)
                == raw_tensor_bytes(d / "rt1.safetensors", k)), k
    out, meta = read_safetensors(d / "rt1.safetensors")
    assert meta["row_temperature"] == "rt.npy" and meta["temperature"] == "1"
    for tau in sorted(set(temps.tolist())):
        p = run_cli(*common, "--temperature", tau, "--out", f"s{tau}.safetensors", cwd=d)
        assert p.returncode == 0, p.stderr
        scalar, _ = read_safetensors(d / f"s{tau}.safetensors")
        rows = temps == np.float32(tau)
        for k in names:
            a, b = out[k][1][rows], scalar[k][1][rows]
            assert a.tobytes() == b.tobytes(), (tau, k)
    logp, lse, h, grad = reference(inputs["x"], inputs["t"], inputs["mask"], REAL,
                                   temperature=temps.astype(np.float64)[:, None],
                                   gl=inputs["gl"], gL=inputs["gL"], gH=inputs["gH"],
                                   softcap=softcap)
    cap_term = 0 if softcap is None else 6 * 2.0**-23 * softcap / temps.min()
    bound = 1e-5 + cap_term + 4e-6 * np.abs(lse).max()
    np.testing.assert_allclose(out["logp"][1], logp, atol=bound, rtol=0)
    np.testing.assert_allclose(out["lse"][1], lse, atol=bound, rtol=0)
    np.testing.assert_allclose(out["entropy"][1], h, atol=bound, rtol=0)
    np.testing.assert_allclose(out["grad_logits"][1][:, :REAL], grad,
                               atol=1e-5 / temps.min(), rtol=1e-5)
    assert np.all(out["grad_logits"][1][:, REAL:] == 0)


def kept_reference(x, targets, mask, ids, gl, gL, gH):
    """float64 logp, lse, entropy and the gradient over each row's kept set (ids, -1 padded):
    softmax over S only, zero gradient outside S."""
    z = x.astype(np.float64)
    logp, lse, h = (np.zeros(len(targets)) for _ in range(3))
    grad = np.zeros_like(z)
    for r in range(len(targets)):
        s = ids[r][ids[r] >= 0]
        zs = z[r, s]
        lse[r] = zs.max() + np.log(np.exp(zs - zs.max()).sum())
        p = np.exp(zs - lse[r])
        h[r] = -(p * (zs - lse[r])).sum()
        g = gL[r] * p - gH[r] * p * (zs - lse[r] + h[r])
        if mask[r]:
            logp[r] = z[r, targets[r]] - lse[r]
            g += gl[r] * ((s == targets[r]) - p)
        grad[r, s] = g
    return logp, lse, h, grad


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_kept_ids_tp_order_and_reference(inputs, softcap):
    """--kept-ids: logp, LSE and entropy over each token's kept set, the gradient only in kept
    columns; the same bits at every --tp and whatever the order of a row's ids; within the
    float64 reference's bound."""
    d = inputs["dir"]
    rng = np.random.default_rng(5)
    width = 70
    ids = np.full((ROWS, width), -1, np.int64)
    for r in range(ROWS):
        n = [70, 1, 33, 64, 5, 70, 40][r]
        s = rng.choice(REAL, size=n, replace=False)
        if inputs["mask"][r] and inputs["t"][r] not in s:
            s[0] = inputs["t"][r]
        ids[r, :n] = s
    shuffled = ids.copy()
    for r in range(ROWS):
        rng.shuffle(shuffled[r])  # -1 padding anywhere in the row
    save_npy(d, logits=inputs["x"], targets=inputs["t"], mask=inputs["mask"], gl=inputs["gl"],
             gL=inputs["gL"], gH=inputs["gH"], kept=ids, kept32=shuffled.astype(np.int32))
    cap = [] if softcap is None else ["--softcap", softcap]
    common = ["logprob", "--logits", "logits.npy", "--targets", "targets.npy", "--mask",
              "mask.npy", "--real-vocab", REAL, "--entropy", "--grad-logp", "gl.npy",
              "--grad-lse", "gL.npy", "--grad-entropy", "gH.npy", *cap]
    names = ("logp", "lse", "entropy", "grad_logits")
    runs = [(1, "kept.npy"), (3, "kept.npy"), (8, "kept.npy"), (2, "kept32.npy")]
    for tp, f in runs:
        p = run_cli(*common, "--tp", tp, "--tile-width", 64, "--kept-ids", f,
                    "--out", f"k{tp}.safetensors", cwd=d)
        assert p.returncode == 0, p.stderr
    for tp, _ in runs[1:]:
        for k in names:
            assert (raw_tensor_bytes(d / f"k{tp}.safetensors", k)
                    == raw_tensor_bytes(d / "k1.safetensors", k)), (tp, k)
    out, meta = read_safetensors(d / "k1.safetensors")
    assert meta["kept_ids"] == "kept.npy"
    x = inputs["x"][:, :REAL].astype(np.float64)
    if softcap is not None:
        x = softcap * np.tanh(x / softcap)
    logp, lse, h, grad = kept_reference(x, inputs["t"], inputs["mask"], ids, inputs["gl"],
                                        inputs["gL"], inputs["gH"])
    if softcap is not None:
        grad = grad * (1 - np.tanh(inputs["x"][:, :REAL].astype(np.float64) / softcap) ** 2)
    bound = 1e-5 + 4e-6 * np.abs(lse).max() + (0 if softcap is None else 6 * 2.0**-23 * softcap)
    np.testing.assert_allclose(out["logp"][1], logp, atol=bound, rtol=0)
    np.testing.assert_allclose(out["lse"][1], lse, atol=bound, rtol=0)
    np.testing.assert_allclose(out["entropy"][1], h, atol=bound, rtol=0)
    g = out["grad_logits"][1]
    np.testing.assert_allclose(g[:, :REAL], grad, atol=1e-5, rtol=1e-5)
    outside = np.ones((ROWS, PADDED), bool)
    for r in range(ROWS):
        outside[r, ids[r][ids[r] >= 0]] = False
    assert np.all(g[outside] == 0)  # every column outside the kept set, padding included


def test_bf16_safetensors_bitwise_equal_across_tp(inputs):
    d = inputs["dir"]
    bits = to_bf16_bits(inputs["x"])
    # One file holding every input; each option picks its tensor by name.
    write_safetensors(d / "batch.safetensors",
                      {"logits": bits, "targets": inputs["t"], "mask": inputs["mask"],
                       "grad_logp": inputs["gl"], "grad_lse": inputs["gL"],
                       "grad_entropy": inputs["gH"]}, bf16={"logits"})
    f = "batch.safetensors"
    outs = {}
    for tp in (1, 2, 3, 8):
        p = run_cli("logprob", "--logits", f, "--targets", f, "--mask", f, "--real-vocab", REAL,
                    "--tp", tp, "--tile-width", 64, "--entropy", "--grad-logp", f, "--grad-lse", f,
                    "--grad-entropy", f, "--out", f"out{tp}.safetensors", cwd=d)
        assert p.returncode == 0, p.stderr
        outs[tp] = {k: raw_tensor_bytes(d / f"out{tp}.safetensors", k)
                    for k in ("logp", "lse", "entropy", "grad_logits")}
    for tp in (2, 3, 8):
        assert outs[tp] == outs[1], f"TP={tp} differs from TP=1"
    out, _ = read_safetensors(d / "out1.safetensors")
    assert out["grad_logits"][0] == "BF16"
    widened = bf16_bits_to_f32(bits)
    logp, lse, h, grad = reference(widened, inputs["t"], inputs["mask"], REAL,
                                   gl=inputs["gl"], gL=inputs["gL"], gH=inputs["gH"])
    np.testing.assert_allclose(out["logp"][1], logp, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out["lse"][1], lse, atol=1e-5, rtol=0)
    g = bf16_bits_to_f32(out["grad_logits"][1])
    # Rounded to bf16 at the final write: within half a bf16 ulp (2^-9 relative) + 1e-5.
    assert np.all(np.abs(g[:, :REAL] - grad) <= 1e-5 + np.abs(grad) * 2.0**-8)
    assert np.all(g[:, REAL:] == 0)


def test_fp16_num_vocab_tiles_temperature_int32_u8(inputs):
    d = inputs["dir"]
    x16 = inputs["x"].copy()
    x16[:, REAL:] = 6e4
    x16 = x16.astype(np.float16)
    save_npy(d, logits=x16, targets=inputs["t"].astype(np.int32),
             mask=inputs["mask"].astype(np.uint8), gl=inputs["gl"])
    p = run_cli("logprob", "--logits", "logits.npy", "--targets", "targets.npy", "--mask",
                "mask.npy", "--real-vocab", REAL, "--num-vocab-tiles", 16, "--tp", 4,
                "--temperature", 0.7, "--grad-logp", "gl.npy", "--out", "out.safetensors", cwd=d)
    assert p.returncode == 0, p.stderr
    out, meta = read_safetensors(d / "out.safetensors")
    assert "entropy" not in out and meta["tile_width"] == "64"
    logp, lse, _, grad = reference(x16.astype(np.float32), inputs["t"], inputs["mask"], REAL,
                                   temperature=0.7, gl=inputs["gl"])
    np.testing.assert_allclose(out["logp"][1], logp, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out["lse"][1], lse, atol=1e-5, rtol=0)
    assert out["grad_logits"][0] == "F16"
    g = out["grad_logits"][1].astype(np.float64)
    assert np.all(np.abs(g[:, :REAL] - grad) <= 1e-5 + np.abs(grad) * 2.0**-11 + 2.0**-25)


def test_no_gradient_no_mask_defaults(inputs):
    d = inputs["dir"]
    t = np.where(inputs["t"] < 0, 5, inputs["t"]) % REAL
    save_npy(d, logits=inputs["x"][:, :REAL], targets=t)
    p = run_cli("logprob", "--logits", "logits.npy", "--targets", "targets.npy", "--out",
                "out.safetensors", cwd=d)
    assert p.returncode == 0, p.stderr
    out, _ = read_safetensors(d / "out.safetensors")
    assert sorted(out) == ["logp", "lse"]  # no entropy, no gradient asked for
    logp, lse, _, _ = reference(inputs["x"][:, :REAL], t, np.ones(ROWS, bool), REAL)
    np.testing.assert_allclose(out["logp"][1], logp, atol=1e-5, rtol=0)


def test_reference_backend_same_bits_and_provenance(inputs):
    d = inputs["dir"]
    save_npy(d, logits=inputs["x"], targets=inputs["t"], mask=inputs["mask"])
    common = ["logprob", "--logits", "logits.npy", "--targets", "targets.npy", "--mask",
              "mask.npy", "--real-vocab", REAL, "--entropy", "--tp", 2]
    p1 = run_cli(*common, "--out", "a.safetensors", "--provenance", "a.json", cwd=d)
    p2 = run_cli(*common, "--backend", "reference", "--out", "b.safetensors", "--provenance",
                 "b.json", cwd=d)
    assert p1.returncode == 0 and p2.returncode == 0, p1.stderr + p2.stderr
    for k in ("logp", "lse", "entropy"):
        assert raw_tensor_bytes(d / "a.safetensors", k) == raw_tensor_bytes(d / "b.safetensors", k)
    a = json.loads((d / "a.json").read_text())
    b = json.loads((d / "b.json").read_text())
    assert a["actual_backend"] == "cpu-canonical-vocab-parallel-logp"
    assert b["actual_backend"] == "cpu-reference-vocab-parallel-logp"
    assert len(a["contract_fingerprint"]) == 64
    assert a["contract_fingerprint"] == b["contract_fingerprint"]


def test_nondeterministic_mode_is_accurate(inputs):
    d = inputs["dir"]
    save_npy(d, logits=inputs["x"], targets=inputs["t"], mask=inputs["mask"])
    p = run_cli("logprob", "--logits", "logits.npy", "--targets", "targets.npy", "--mask",
                "mask.npy", "--real-vocab", REAL, "--tp", 2, "--deterministic", "false",
                "--out", "out.safetensors", "--provenance", "p.json", cwd=d)
    assert p.returncode == 0, p.stderr
    out, meta = read_safetensors(d / "out.safetensors")
    assert meta["deterministic"] == "false"
    logp, lse, _, _ = reference(inputs["x"], inputs["t"], inputs["mask"], REAL)
    np.testing.assert_allclose(out["lse"][1], lse, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out["logp"][1], logp, atol=1e-5, rtol=0)
    prov = json.loads((d / "p.json").read_text())
    assert "fixed_topology" in json.dumps(prov)


def test_overwrites_existing_output_atomically(inputs):
    d = inputs["dir"]
    save_npy(d, logits=inputs["x"], targets=inputs["t"], mask=inputs["mask"])
    (d / "out.safetensors").write_bytes(b"old")
    p = run_cli("logprob", "--logits", "logits.npy", "--targets", "targets.npy", "--mask",
                "mask.npy", "--real-vocab", REAL, "--out", "out.safetensors", cwd=d)
    assert p.returncode == 0, p.stderr
    out, _ = read_safetensors(d / "out.safetensors")
    assert out["logp"][1].shape == (ROWS,)
    assert sorted(os.listdir(d)) == ["logits.npy", "mask.npy", "out.safetensors", "targets.npy"]


def test_top_k_top_p_equal_the_kept_ids_of_the_selected_sets(inputs):
    """--top-k / --top-p: every token's kept set recomputed (exactly top_k ids, the largest
    logits; then top-p within them); the same bits at every --tp, and the bits of --kept-ids
    given those sets (the float64 rule computed here); errors exit with a message."""
    d = inputs["dir"]
    x, t, mask = inputs["x"], inputs["t"].copy(), inputs["mask"]
    k, top_p = 6, 0.9
    ids = np.full((ROWS, k), -1, np.int64)
    for r in range(ROWS):
        z = x[r, :REAL].astype(np.float64)
        order = sorted(range(REAL), key=lambda i: (-z[i], i))[:k]
        zs = z[order]
        lse = zs.max() + np.log(np.exp(zs - zs.max()).sum())
        kept, before = [], 0.0
        for i, v in zip(order, zs):
            if not before < top_p:
                break
            kept.append(i)
            before += np.exp(v - lse)
        ids[r, :len(kept)] = sorted(kept)
        if mask[r]:
            t[r] = ids[r, 0]  # inside the set
    save_npy(d, logits=x, targets=t, mask=mask, gl=inputs["gl"], kept=ids)
    common = ["logprob", "--logits", "logits.npy", "--targets", "targets.npy", "--mask",
              "mask.npy", "--real-vocab", REAL, "--tile-width", 64, "--entropy", "--grad-logp",
              "gl.npy"]
    names = ("logp", "lse", "entropy", "grad_logits")
    for tp in (1, 3):
        p = run_cli(*common, "--tp", tp, "--top-k", k, "--top-p", top_p,
                    "--out", f"tk{tp}.safetensors", cwd=d)
        assert p.returncode == 0, p.stderr
    p = run_cli(*common, "--kept-ids", "kept.npy", "--out", "given.safetensors", cwd=d)
    assert p.returncode == 0, p.stderr
    for k_ in names:
        want = raw_tensor_bytes(d / "given.safetensors", k_)
        assert raw_tensor_bytes(d / "tk1.safetensors", k_) == want, k_
        assert raw_tensor_bytes(d / "tk3.safetensors", k_) == want, k_
    _, meta = read_safetensors(d / "tk1.safetensors")
    assert meta["top_k"] == str(k)
    p = run_cli(*common, "--top-k", 2000, "--out", "bad.safetensors", cwd=d)
    assert p.returncode != 0 and "top_k of row 0 is 2000" in p.stderr, p.stderr
    p = run_cli(*common, "--top-k", 3, "--kept-ids", "kept.npy", "--out", "bad.safetensors",
                cwd=d)
    assert p.returncode != 0 and "excludes" in p.stderr, p.stderr


def test_empty_kept_full_scores_rows_of_only_minus_one_over_the_full_vocabulary(inputs):
    """--empty-kept full: a --kept-ids row of only -1 (an unrestricted row of a rollout batch)
    gets the bits of the run without --kept-ids, gradient included; the other rows those of
    their kept set; the same bits at every --tp; without it such an active row exits 2."""
    d = inputs["dir"]
    t, mask = inputs["t"], inputs["mask"]
    ids = np.full((ROWS, 4), -1, np.int64)
    restricted = [1, 3, 6]
    for r in restricted:
        ids[r, :3] = [t[r], (t[r] + 1) % REAL, (t[r] + 500) % REAL]
    save_npy(d, logits=inputs["x"], targets=t, mask=mask, gl=inputs["gl"], gL=inputs["gL"],
             gH=inputs["gH"], kept=ids)
    common = ["logprob", "--logits", "logits.npy", "--targets", "targets.npy", "--mask",
              "mask.npy", "--real-vocab", REAL, "--entropy", "--grad-logp", "gl.npy",
              "--grad-lse", "gL.npy", "--grad-entropy", "gH.npy", "--tile-width", 64]
    for tp in (1, 3):
        p = run_cli(*common, "--tp", tp, "--kept-ids", "kept.npy", "--empty-kept", "full",
                    "--out", f"mixed{tp}.safetensors", cwd=d)
        assert p.returncode == 0, p.stderr
    p = run_cli(*common, "--tp", 1, "--out", "plain.safetensors", cwd=d)
    assert p.returncode == 0, p.stderr
    mixed, meta = read_safetensors(d / "mixed1.safetensors")
    assert meta["empty_kept"] == "full"
    plain, _ = read_safetensors(d / "plain.safetensors")
    full_rows = [r for r in range(ROWS) if r not in restricted]
    for k in ("logp", "lse", "entropy", "grad_logits"):
        assert (raw_tensor_bytes(d / "mixed3.safetensors", k)
                == raw_tensor_bytes(d / "mixed1.safetensors", k)), k
        a, b = mixed[k][1][full_rows], plain[k][1][full_rows]
        assert a.tobytes() == b.tobytes(), k
    g = mixed["grad_logits"][1]
    for r in restricted:
        outside = np.ones(PADDED, bool)
        outside[ids[r][ids[r] >= 0]] = False
        assert np.all(g[r][outside] == 0)
    p = run_cli(*common, "--kept-ids", "kept.npy", "--out", "bad.safetensors", cwd=d)
    assert p.returncode == 2 and "empty_kept=full" in p.stderr, p.stderr
