"""Recomputed kept sets from Python: top_k= / top_p= (a number or a tensor of the targets'
shape) and return_kept= on vocab_parallel_logprobs. The call equals the call given the returned
sets as kept_ids (bitwise: logp, entropy, gradient), the sets are the float64 oracle's rule on
the scored logits, a scalar is every token's, an unrestricted call is the plain one, a call
mixing restricted and unrestricted tokens scores each as its own call would; TP=2 over
gloo gives the TP=1 bits and sets (rank 0 reading Megatron's transposed view), and a top_k that
differs on one rank fails every rank; bad arguments raise naming the field."""

import math

import pytest
import torch

from detlogp import LogprobContractError, _ops
from detlogp.torch import vocab_parallel_logprobs
from helpers import assert_bitwise
from kept_recompute_worker import parameters
from spawn import run_workers

REAL, PADDED = 1000, 1024
TIMEOUT_S = 300


def _inputs(stream=3):
    gen = torch.Generator().manual_seed(stream)
    full = torch.randn(3, 5, PADDED, generator=gen) * 4
    targets = torch.randint(0, REAL, (3, 5), generator=gen)
    top_k, top_p = parameters(gen)
    return full, targets, top_k, top_p


def run(logits, targets, **kw):
    x = logits.detach().clone().requires_grad_(True)
    logp, ent, kept = vocab_parallel_logprobs(x, targets, real_vocab=REAL, entropy=True,
                                              outside_kept="neg_inf", return_kept=True, **kw)
    g = torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))
    (g.sum() + 0.5 * ent.sum()).backward()
    return logp.detach(), ent.detach(), kept, x.grad


def oracle(z, k, p):
    """The rule in float64 on one row's real scored values (docs/numerics.md)."""
    order = sorted(range(len(z)), key=lambda i: (-z[i], i))
    n = k if k > 0 else len(z)
    top = order[:n]
    if p < 1.0:
        m = max(z[i] for i in top)
        lse = m + math.log(sum(math.exp(z[i] - m) for i in top))
        d, kept = 0.0, 0
        for i in top:
            if not d < p:
                break
            kept += 1
            d += math.exp(z[i] - lse)
        top = top[:kept]
    return sorted(top)


def test_equals_the_call_given_the_returned_sets_and_the_rule():
    full, targets, top_k, top_p = _inputs()
    logp, ent, kept, grad = run(full, targets, top_k=top_k, top_p=top_p)
    assert kept.dtype == torch.int64 and kept.shape[:-1] == targets.shape
    g_logp, g_ent, g_kept, g_grad = run(full, targets, kept_ids=kept)
    assert_bitwise(logp, g_logp, "logp")
    assert_bitwise(ent, g_ent, "entropy")
    assert_bitwise(grad, g_grad, "grad")
    assert torch.equal(kept, g_kept)
    for b in range(3):
        for s in range(5):
            ids = [int(v) for v in kept[b, s] if v >= 0]
            z = [float(v) for v in full[b, s, :REAL]]
            assert ids == oracle(z, int(top_k[b, s]), float(top_p[b, s])), (b, s)


def test_a_scalar_is_every_tokens_and_the_causal_shift_reads_in_place():
    full, targets, _, _ = _inputs(5)
    logits, tg = full[:, :-1], targets[:, 1:]  # rows with holes
    logp, _, kept, _ = run(logits, tg, top_k=20, top_p=0.8)
    want, _, want_kept, _ = run(logits, tg, top_k=torch.full(tg.shape, 20, dtype=torch.int32),
                                top_p=torch.full(tg.shape, 0.8))
    assert_bitwise(logp, want, "logp")
    assert torch.equal(kept, want_kept)
    assert kept.shape == tg.shape + (kept.shape[-1],) and kept.shape[-1] <= 20


def test_unrestricted_is_the_plain_call():
    full, targets, _, _ = _inputs(6)
    logp, ent, kept, grad = run(full, targets, top_k=0, top_p=1.0)
    p_logp, p_ent, p_kept, p_grad = run(full, targets)
    assert_bitwise(logp, p_logp, "logp")
    assert_bitwise(grad, p_grad, "grad")
    assert kept.shape == targets.shape + (0,) and p_kept.shape == kept.shape


@pytest.mark.parametrize("kw, field, text", [
    ({"top_k": 2000}, "top_k", "top_k of row"),
    ({"top_p": 0.0}, "top_p", "top_p of row"),
    ({"top_k": 5, "kept_ids": torch.zeros(3, 5, 1, dtype=torch.int64)}, "kept_ids",
     "pass either kept_ids or top_k/top_p"),
])
def test_bad_parameters_name_the_field(kw, field, text):
    full, targets, _, _ = _inputs()
    with pytest.raises(LogprobContractError, match=text) as err:
        vocab_parallel_logprobs(full, targets, real_vocab=REAL, **kw)
    assert err.value.field == field


@pytest.mark.parametrize("kw", [{"top_k": 1.5}, {"top_p": "x"}, {"top_k": True},
                                {"top_k": torch.ones(2, dtype=torch.int32)},
                                {"return_kept": 1}])
def test_bad_argument_types_raise(kw):
    full, targets, _, _ = _inputs()
    with pytest.raises(LogprobContractError):
        vocab_parallel_logprobs(full, targets, real_vocab=REAL, **kw)


def test_a_target_outside_its_set_raises_by_default():
    full, targets, _, _ = _inputs()
    with pytest.raises(LogprobContractError, match="selected by its top_k/top_p"):
        vocab_parallel_logprobs(full, targets, real_vocab=REAL, top_k=1)


def test_opcheck_with_top_k_top_p():
    full, targets, top_k, top_p = _inputs()
    args = (full.requires_grad_(), targets, None, "", REAL, -100, 1.0, True, True, None, None,
            None, None, True, "", None, None, None, True, top_k, top_p)
    torch.library.opcheck(_ops.vocab_parallel_logprobs, args)


def test_compiled_equals_eager_and_return_kept_raises_under_compile():
    full, targets, top_k, top_p = _inputs()

    def loss(x, t, k, p):
        logp, ent = vocab_parallel_logprobs(x, t, real_vocab=REAL, entropy=True, top_k=k,
                                            top_p=p, outside_kept="neg_inf")
        logp = torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))
        return (logp.sum() + 0.5 * ent.sum()), logp

    x1 = full.clone().requires_grad_()
    l1, p1 = loss(x1, targets, top_k, top_p)
    l1.backward()
    x2 = full.clone().requires_grad_()
    l2, p2 = torch.compile(loss, backend="aot_eager", fullgraph=True)(x2, targets, top_k, top_p)
    l2.backward()
    assert_bitwise(p1.detach(), p2.detach())
    assert_bitwise(x1.grad, x2.grad)

    def with_kept(x, t):
        return vocab_parallel_logprobs(x, t, real_vocab=REAL, top_k=5, return_kept=True)

    with pytest.raises(Exception, match="return_kept=True is not available under torch.compile"):
        torch.compile(with_kept, backend="aot_eager", fullgraph=True)(full.clone(), targets)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import kept_recompute_worker

    return run_workers(kept_recompute_worker.main, tmp_path_factory.mktemp("recompute"), 2,
                       TIMEOUT_S)[0]


def test_tp2_over_gloo_gives_the_tp1_bits_and_disagreement_fails_together(ranks):
    for rank, res in enumerate(ranks):
        ref = res["reference"]
        assert "error" not in ref, ref.get("error")
        assert torch.isinf(ref["logp"][0, 1]) or ref["kept"][0, 1].eq(REAL - 1).any()
        for case in ("tp", "given", "after"):
            got = res[case]
            assert "error" not in got, (rank, case, got.get("error"))
            assert_bitwise(got["logp"], ref["logp"], f"{case} logp rank {rank}")
            assert_bitwise(got["entropy"], ref["entropy"], f"{case} entropy rank {rank}")
            assert_bitwise(got["grad"], ref["grad"], f"{case} grad rank {rank}")
            assert torch.equal(got["kept"], ref["kept"]), (rank, case)
        got = res["different top_k"]
        assert "error" in got, rank
        assert got["field"] in ("top_k", None), got


def _fused_inputs():
    gen = torch.Generator().manual_seed(9)
    hidden = torch.randn(12, 32, generator=gen).to(torch.bfloat16)
    weight = (torch.randn(PADDED, 32, generator=gen) * 0.5).to(torch.bfloat16)
    top_k, top_p = parameters(gen)
    return hidden, weight, top_k.reshape(-1)[:12], top_p.reshape(-1)[:12]


def _fused(hidden, weight, targets, **kw):
    from detlogp import fused_linear_logprobs

    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    logp, lse, ent, kept = fused_linear_logprobs(h, w, targets, real_vocab=REAL, entropy=True,
                                                 outside_kept="neg_inf", return_kept=True, **kw)
    g = torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))
    (g.sum() + 0.25 * lse.sum() + 0.5 * ent.sum()).backward()
    return logp.detach(), lse.detach(), ent.detach(), kept, h.grad, w.grad


def test_fused_equals_the_call_given_the_returned_sets_and_the_logits_ops_sets():
    from detlogp import linear_logits

    hidden, weight, top_k, top_p = _fused_inputs()
    targets = torch.zeros(12, dtype=torch.int64)
    got = _fused(hidden, weight, targets, top_k=top_k, top_p=top_p)
    kept = got[3]
    assert kept.shape[0] == 12 and kept.dtype == torch.int64
    # The logits operator's sets on the fused op's canonical logits.
    z = torch.as_tensor(linear_logits(hidden, weight))
    _, z_kept = vocab_parallel_logprobs(z, targets, real_vocab=REAL, top_k=top_k, top_p=top_p,
                                        outside_kept="neg_inf", return_kept=True)
    assert torch.equal(kept, z_kept)
    targets = kept[:, 0].clone()  # inside each set
    got = _fused(hidden, weight, targets, top_k=top_k, top_p=top_p)
    want = _fused(hidden, weight, targets, kept_ids=kept)
    for a, b, name in zip(got, want, ("logp", "lse", "entropy", "kept", "hidden grad",
                                       "weight grad")):
        if name == "kept":
            assert torch.equal(a, b)
        else:
            assert_bitwise(a, b, name)
    assert torch.isfinite(got[0]).all()
    # A scalar is every token's; unrestricted is the plain call (no kept sets).
    one = _fused(hidden, weight, targets, top_k=7)
    many = _fused(hidden, weight, targets, top_k=torch.full((12,), 7, dtype=torch.int32))
    assert_bitwise(one[0], many[0], "scalar top_k")
    off = _fused(hidden, weight, targets, top_k=0)
    plain = _fused(hidden, weight, targets)
    assert_bitwise(off[0], plain[0], "unrestricted")
    assert off[3].shape == (12, 0)


def test_fused_mixed_rows_are_the_plain_and_the_kept_calls_rows():
    # Restricted and unrestricted rows in one call: each row as its own call would score it.
    hidden, weight, top_k, top_p = _fused_inputs()
    off = torch.tensor([1, 4, 5, 10])
    top_k, top_p = top_k.clone(), top_p.clone()
    top_k[off], top_p[off] = 0, 1.0
    probe = _fused(hidden, weight, torch.zeros(12, dtype=torch.int64), top_k=top_k, top_p=top_p)
    kept = probe[3]
    assert (kept[off] == -1).all() and (kept[top_k.ne(0) | top_p.lt(1)][:, 0] >= 0).all()
    targets = torch.where(kept[:, 0] >= 0, kept[:, 0], torch.arange(12) * 71)
    got = _fused(hidden, weight, targets, top_k=top_k, top_p=top_p)
    plain = _fused(hidden, weight, targets)
    for j, name in ((0, "logp"), (1, "lse"), (2, "entropy"), (4, "hidden grad")):
        assert_bitwise(got[j][off], plain[j][off], f"unrestricted rows' {name}")
    restricted = kept.clone()
    restricted[off, 0] = targets[off]  # the unrestricted rows given a set: a kept-set call
    want = _fused(hidden, weight, targets, kept_ids=restricted)
    on = torch.ones(12, dtype=torch.bool)
    on[off] = False
    for j, name in ((0, "logp"), (1, "lse"), (2, "entropy"), (4, "hidden grad")):
        assert_bitwise(got[j][on], want[j][on], f"restricted rows' {name}")
    # The returned sets given back whole, rows of only -1 over the full vocabulary.
    given = _fused(hidden, weight, targets, kept_ids=kept, empty_kept="full")
    for a, b, name in zip(got, given, ("logp", "lse", "entropy", "kept", "hidden grad",
                                        "weight grad")):
        if name != "kept":
            assert_bitwise(a, b, name)
    with pytest.raises(LogprobContractError, match="empty_kept=full"):
        _fused(hidden, weight, targets, kept_ids=kept)


def test_fused_numpy_inputs_give_the_tensor_calls_sets():
    from detlogp import fused_linear_logprobs

    hidden, weight, _, _ = _fused_inputs()
    h, w = hidden.float(), weight.float()
    targets = torch.zeros(12, dtype=torch.int64)
    t_logp, _, t_kept = fused_linear_logprobs(h, w, targets, real_vocab=REAL, top_k=9,
                                              top_p=0.9, outside_kept="neg_inf", return_kept=True)
    n_logp, _, n_kept = fused_linear_logprobs(h.numpy(), w.numpy(), targets.numpy(),
                                              real_vocab=REAL, top_k=9, top_p=0.9,
                                              outside_kept="neg_inf", return_kept=True)
    assert_bitwise(t_logp, torch.from_numpy(n_logp), "logp")
    assert torch.equal(t_kept, torch.from_numpy(n_kept))
