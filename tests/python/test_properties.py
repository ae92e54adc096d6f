"""Property-based tests (hypothesis) of detlogp.torch.vocab_parallel_logprobs on random
problems: shapes, TP degrees with uneven tile-aligned shard tables (the last shard ragged),
tile widths, masks, ignore_index, dtypes and temperatures. TP ranks run as threads of this
process (thread_world.py), through the real distributed path.

- the outputs and every rank's gradient are the TP=1 bits at every TP degree and shard table;
- a token's outputs and gradient do not depend on the other tokens of its batch (a sub-batch)
  nor on its row (a permutation);
- logp is within the bound docs/numerics.md ("Accuracy of logp") documents against a float64
  oracle on the same fp32 scores, and the gradient within the bound that follows from it
  through the backward formula (numerics.md, "Backward").

Examples are derandomized (the same ones every run) and bounded: with the profile below the
file takes about 10 s on two loaded cores (450 examples).
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import detlogp
from detlogp.torch import vocab_parallel_logprobs
from helpers import assert_bitwise
from thread_world import ThreadWorld

PROFILE = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PAD_JUNK = 1e4  # padding columns hold junk that must never count


@st.composite
def problems(draw, max_tp=4):
    tp = draw(st.integers(1, max_tp))
    w = draw(st.sampled_from([32, 64, 128]))
    widths = [draw(st.integers(1, 3)) * w for _ in range(tp)]
    widths[-1] += draw(st.integers(0, w - 1))  # the last bound may be ragged (= padded)
    starts = np.cumsum([0] + widths)
    bounds = [(int(starts[r]), int(starts[r + 1])) for r in range(tp)]
    padded = bounds[-1][1]
    lead = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    n = math.prod(lead)
    ignore = draw(st.sampled_from([-100, None, -1]))  # outside the vocabulary
    return {
        "tp": tp, "w": w, "bounds": bounds, "padded": padded, "lead": lead,
        "real": draw(st.integers(max(2, padded - 2 * w), padded)),
        "dtype": draw(st.sampled_from(list(DTYPES))),
        "temperature": draw(st.sampled_from([1.0, 0.5, 0.7, 2.0])),
        "scale": draw(st.sampled_from([0.5, 3.0, 12.0])),
        "seed": draw(st.integers(0, 2**31 - 1)),
        "ignore": ignore,
        "ignored": draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        "mask": draw(st.none() | st.lists(st.booleans(), min_size=n, max_size=n)),
    }


def tensors(p):
    """fp32 logits widened from the drawn dtype, targets, loss mask, two gradient weights."""
    g = torch.Generator().manual_seed(p["seed"])
    x = torch.randn(p["lead"] + (p["padded"],), generator=g) * p["scale"]
    x[..., p["real"]:] = PAD_JUNK
    x = x.to(DTYPES[p["dtype"]])
    t = torch.randint(0, p["real"], p["lead"], generator=g)
    if p["ignore"] is not None:
        t[torch.tensor(p["ignored"]).view(p["lead"])] = p["ignore"]
    mask = None if p["mask"] is None else torch.tensor(p["mask"]).view(p["lead"])
    w1, w2 = torch.randn(p["lead"], generator=g), torch.randn(p["lead"], generator=g)
    return x, t, mask, (w1, w2)


def run(p, x, t, mask, weights, group, bounds):
    """logp, entropy and the gradient of ``x`` (this rank's columns) of one call."""
    leaf = x.clone().requires_grad_()
    logp, ent = vocab_parallel_logprobs(
        leaf, t, group=group, vocab_start=bounds, real_vocab=p["real"], loss_mask=mask,
        ignore_index=p["ignore"], temperature=p["temperature"], entropy=True,
        tile_width=p["w"])
    ((weights[0] * logp).sum() + (weights[1] * ent).sum()).backward()
    return logp.detach(), ent.detach(), leaf.grad


def tp1(p, x, t, mask, weights):
    return run(p, x, t, mask, weights, detlogp.SelfComm(), [(0, p["padded"])])


def at_tp(p, x, t, mask, weights):
    """The call at p's TP degree and shard table, its ranks as threads: logp and entropy
    (checked bitwise equal on every rank) and the gradient of the whole vocabulary (the
    ranks' shard gradients side by side)."""

    def rank(r, comm):
        s, e = p["bounds"][r]
        return run(p, x[..., s:e].contiguous(), t, mask, weights, comm, p["bounds"])

    ranks = ThreadWorld(p["tp"]).run(rank)
    for r, got in enumerate(ranks[1:], 1):
        assert_bitwise(got[0], ranks[0][0], f"logp of rank {r} against rank 0")
        assert_bitwise(got[1], ranks[0][1], f"entropy of rank {r} against rank 0")
    return ranks[0][0], ranks[0][1], torch.cat([got[2] for got in ranks], -1)


@PROFILE
@given(problems())
def test_bitwise_equal_across_tp_degrees_and_shard_tables(p):
    x, t, mask, weights = tensors(p)
    got, ref = at_tp(p, x, t, mask, weights), tp1(p, x, t, mask, weights)
    for name, a, b in zip(("logp", "entropy", "grad"), got, ref):
        assert_bitwise(a, b, f"{name} at TP={p['tp']}, bounds {p['bounds']}")


@PROFILE
@given(problems(), st.randoms(use_true_random=False))
def test_rows_independent_of_batch_composition_and_order(p, rnd):
    x, t, mask, weights = tensors(p)
    n = math.prod(p["lead"])
    flat = lambda a: None if a is None else a.reshape((n,) + tuple(a.shape[len(p["lead"]):]))
    x, t, mask, weights = flat(x), flat(t), flat(mask), tuple(flat(w) for w in weights)
    q = dict(p, lead=(n,))
    whole = at_tp(q, x, t, mask, weights)
    perm = list(range(n))
    rnd.shuffle(perm)
    sub = sorted(rnd.sample(range(n), rnd.randint(1, n)))
    for rows in (perm, sub):  # the rows in another order; a sub-batch of them
        idx = torch.tensor(rows)
        pick = lambda a: None if a is None else a[idx]
        got = at_tp(dict(q, lead=(len(rows),)), x[idx], t[idx], pick(mask),
                    tuple(pick(w) for w in weights))
        for name, a, b in zip(("logp", "entropy", "grad"), got, whole):
            assert_bitwise(a, b[idx], f"{name} of rows {rows} at TP={p['tp']}")


def _ulp(a):
    """ulp of fp32 values (float64 array of them)."""
    return np.spacing(np.abs(a).astype(np.float32)).astype(np.float64)


@PROFILE
@given(problems(max_tp=1))
def test_logp_and_gradient_within_the_documented_bound_of_a_float64_oracle(p):
    x, t, mask, weights = tensors(p)
    n, real, tau = math.prod(p["lead"]), p["real"], p["temperature"]
    logp, _, grad = tp1(p, x, t, mask, weights)
    # The oracle on the same fp32 scores z = fp32(x) / tau (numerics.md, "Temperature").
    z32 = x.float().reshape(n, -1)[:, :real]
    if tau != 1.0:
        z32 = z32 / torch.tensor(tau, dtype=torch.float32)
    z = z32.double()
    lse = torch.logsumexp(z, -1)
    logsm = z - lse[:, None]
    prob = logsm.exp()
    ent = -(prob * logsm).sum(-1)
    tf = t.reshape(n)
    active = tf != (p["ignore"] if p["ignore"] is not None else -(2**62))
    if mask is not None:
        active &= mask.reshape(n)
    safe = torch.where(active, tf, torch.zeros_like(tf))
    want = torch.where(active, logsm.gather(1, safe[:, None])[:, 0], torch.zeros(n).double())

    # |logp - logp*| <= ulp(LSE) / 2 + ulp(logp) / 2 + 1e-5 (numerics.md, "Accuracy of logp").
    got = logp.reshape(n).double().numpy()
    lse_err = _ulp(lse.numpy()) / 2 + 1e-5
    assert (np.abs(got - want.numpy()) <= lse_err + _ulp(want.numpy()) / 2).all()

    # The gradient of w1 * logp + w2 * entropy. The canon's backward computes p = exp(z - LSE)
    # with LSE off by at most lse_err and exp within 1 ulp, so p is off by a relative
    # (lse_err + 2^-22) (e^x - 1 <= 2x for x this small); each term (numerics.md, "Backward")
    # carries that error times its factor, plus a few fp32 roundings of its value, then one
    # division by tau and, for bf16 and fp16, the narrowing (half an ulp of the dtype).
    w1 = torch.where(active, weights[0].reshape(n), torch.zeros(n)).double()
    w2 = weights[1].reshape(n).double()
    onehot = torch.zeros_like(z).scatter_(1, safe[:, None], 1.0) * active[:, None]
    dz = w1[:, None] * (onehot - prob) + w2[:, None] * (prob * (lse[:, None] - z - ent[:, None]))
    expect = dz / tau
    spread = (lse[:, None] - z).abs() + ent.abs()[:, None] + 1
    factor = (w1.abs()[:, None] + w2.abs()[:, None] * spread) / tau
    rel = torch.from_numpy(lse_err)[:, None] + 2.0**-22
    # det_exp's 1 ulp holds on [-87, 0] (numerics.md): below, p is under the smallest normal
    # float, 2^-126, and may be off by that much.
    bound = factor * (prob * rel + 8 * 2.0**-24 * (prob + onehot) + 2.0**-126)
    if p["dtype"] != "fp32":  # half an ulp of the dtype, relative, or of its subnormals
        rel_half_ulp, subnormal_half_ulp = {"bf16": (2.0**-8, 2.0**-134),
                                            "fp16": (2.0**-11, 2.0**-25)}[p["dtype"]]
        bound = bound + expect.abs() * rel_half_ulp + subnormal_half_ulp
    got_grad = grad.reshape(n, -1).double()
    assert (got_grad[:, real:] == 0).all()  # padding columns: exactly +0
    err = (got_grad[:, :real] - expect).abs()
    worst = (err - bound).max()
    assert worst <= 0, f"gradient off by {float(err.max()):.3g}, over its bound by {worst:.3g}"
