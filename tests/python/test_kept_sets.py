"""Sampling-replay kept sets from Python: kept_ids= (the targets' shape + [K], -1 padded) and
outside_kept= on vocab_parallel_logprobs. Each token's logp and entropy are the canon's own on
its kept row (the plain call on a vocabulary of the kept scores in ascending id order), through
N-D logits and the causal shift's strided view; the gradient reaches kept columns only; float64
oracle; a target outside its set raises or scores -inf; TP=2 and TP=4 over gloo give the TP=1
bits whatever each rank's id order and memory layout, and ranks with different sets fail
together; the custom op passes opcheck and compiles."""

import pytest
import torch

from detlogp import LogprobContractError, _ops
from detlogp.torch import vocab_parallel_logprobs
from helpers import assert_bitwise
from kept_sets_worker import kept_sets
from spawn import run_workers

REAL, PADDED = 1000, 1024
TIMEOUT_S = 300


def run(logits, targets, kept, **kw):
    x = logits.detach().clone().requires_grad_(True)
    logp, ent = vocab_parallel_logprobs(x, targets, real_vocab=REAL, entropy=True, kept_ids=kept,
                                        **kw)
    (logp.sum() + 0.5 * ent.sum()).backward()
    return logp.detach(), ent.detach(), x.grad


def bits(t):
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def _inputs(dtype=torch.float32, stream=7, k=40):
    gen = torch.Generator().manual_seed(stream)
    full = (torch.randn(3, 6, PADDED, generator=gen) * 6).to(dtype)
    targets = torch.randint(0, REAL, (3, 6), generator=gen)
    return full, targets, kept_sets(targets, gen, k, REAL)


@pytest.mark.parametrize("view", ["contiguous", "shift", "transposed"])
def test_each_token_is_the_canon_of_its_kept_row(view):
    full, targets, kept = _inputs()
    if view == "shift":  # the causal shift: rows with holes
        logits, targets, kept = full[:, :-1], targets[:, 1:], kept[:, 1:]
    elif view == "transposed":  # [b, s] read from Megatron's [s, b] buffer
        logits = full.transpose(0, 1).contiguous().transpose(0, 1)
    else:
        logits = full
    logp, ent, grad = run(logits, targets, kept.to(torch.int32))
    for b in range(targets.shape[0]):
        for s in range(targets.shape[1]):
            ids = torch.sort(kept[b, s][kept[b, s] >= 0]).values
            row = logits[b, s, ids].detach().clone().float().requires_grad_(True)
            pos = int((ids == targets[b, s]).nonzero())
            p_logp, p_ent = vocab_parallel_logprobs(row, torch.tensor(pos), real_vocab=len(ids),
                                                    entropy=True, tile_width=128)
            (p_logp + 0.5 * p_ent).backward()
            assert_bitwise(logp[b, s], p_logp.detach(), f"logp {b},{s}")
            assert_bitwise(ent[b, s], p_ent.detach(), f"entropy {b},{s}")
            assert_bitwise(grad[b, s, ids], row.grad, f"grad {b},{s}")
            outside = torch.ones(PADDED, dtype=torch.bool)
            outside[ids] = False
            assert torch.equal(bits(grad[b, s][outside]), torch.zeros(int(outside.sum()),
                                                                      dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_views_and_id_order_give_the_same_bits(dtype):
    full, targets, kept = _inputs(dtype)
    base = run(full, targets, kept, softcap=15.0, temperature=0.8)
    shuffled = kept[..., torch.randperm(kept.shape[-1])]
    transposed = full.transpose(0, 1).contiguous().transpose(0, 1)
    for logits, k in ((full, shuffled), (transposed, kept)):
        for a, b in zip(base, run(logits, targets, k, softcap=15.0, temperature=0.8)):
            assert_bitwise(a, b)
    # The kept sets matter: not the full-vocabulary call.
    assert not torch.equal(bits(base[0]), bits(run(full, targets, None)[0]))


def test_accurate_against_float64():
    full, targets, kept = _inputs(stream=11, k=300)
    logp, ent, grad = run(full, targets, kept)
    for b in range(3):
        for s in range(6):
            ids = kept[b, s][kept[b, s] >= 0]
            z = full[b, s, ids].double()
            lse = torch.logsumexp(z, 0)
            p = torch.exp(z - lse)
            h = -(p * (z - lse)).sum()
            want_logp = full[b, s, targets[b, s]].double() - lse
            assert abs(logp[b, s].item() - want_logp.item()) < 2e-5 * max(1, abs(lse.item()))
            assert abs(ent[b, s].item() - h.item()) < 2e-5 * max(1, abs(h.item()))
            onehot = (ids == targets[b, s]).double()
            want = (onehot - p) + 0.5 * p * ((lse - z) - h)
            assert torch.allclose(grad[b, s, ids].double(), want, atol=2e-5, rtol=1e-4)


def test_outside_targets_score_minus_inf_or_raise():
    full, targets, kept = _inputs()
    kept = kept.clone()
    kept[1, 2] = torch.where(kept[1, 2] == targets[1, 2], -1, kept[1, 2])
    kept[1, 2, 0] = (targets[1, 2] + 1) % REAL if kept[1, 2, 0] < 0 else kept[1, 2, 0]
    with pytest.raises(LogprobContractError) as info:
        run(full, targets, kept)
    assert info.value.field == "kept_ids"
    assert f"row 8: target id {int(targets[1, 2])} is not in" in str(info.value)
    logp, ent, grad = run(full, targets, kept, outside_kept="neg_inf")
    assert logp[1, 2].item() == float("-inf") and torch.isfinite(ent[1, 2])
    # No logp gradient from that token: the gradient of the entropy term alone.
    x = full.detach().clone().requires_grad_(True)
    lp, en = vocab_parallel_logprobs(x, targets, real_vocab=REAL, entropy=True, kept_ids=kept,
                                     outside_kept="neg_inf")
    mask = torch.ones_like(lp)
    mask[1, 2] = 0
    ((lp.nan_to_num(neginf=0.0) * mask).sum() + 0.5 * en.sum()).backward()
    assert_bitwise(grad[1, 2], x.grad[1, 2])


def test_masked_tokens_need_no_set():
    full, targets, kept = _inputs()
    kept = kept.clone()
    targets = targets.clone()
    targets[0, 3] = -100
    kept[0, 3] = -1
    logp, _, grad = run(full, targets, kept)
    assert bits(logp[0, 3]).item() == 0
    assert torch.isfinite(logp).all()


@pytest.mark.parametrize("bad,text", [
    ("float", "int32 or int64"),
    ("shape", "the targets' shape"),
    ("empty", "K >= 1"),
    ("duplicate", "twice"),
    ("out of vocab", "real vocabulary"),
    ("outside_kept", "'error' or 'neg_inf'"),
])
def test_bad_kept_ids_raise(bad, text):
    full, targets, kept = _inputs()
    kw = {}
    if bad == "float":
        kept = kept.float()
    elif bad == "shape":
        kept = kept[:, :5]
    elif bad == "empty":
        kept = kept[..., :0]
    elif bad == "duplicate":
        kept = kept.clone()
        kept[2, 1, :2] = targets[2, 1]
    elif bad == "out of vocab":
        kept = kept.clone()
        kept[2, 1, kept[2, 1] != targets[2, 1]] = REAL
    else:
        kw["outside_kept"] = "drop"
    with pytest.raises(LogprobContractError) as info:
        run(full, targets, kept, **kw)
    assert text in str(info.value)


def test_opcheck_with_kept_ids():
    full, targets, kept = _inputs()
    logits = full.requires_grad_()
    args = (logits, targets, None, "", REAL, -100, 1.0, True, True, None, None, None, None,
            True, "", 5.0, None, kept, True)
    torch.library.opcheck(_ops.vocab_parallel_logprobs, args)


def test_compiled_equals_eager():
    full, targets, kept = _inputs()

    def loss(x, t, k):
        logp, ent = vocab_parallel_logprobs(x, t, real_vocab=REAL, entropy=True, kept_ids=k)
        return (logp.sum() + 0.5 * ent.sum()), logp

    x1 = full.clone().requires_grad_()
    l1, p1 = loss(x1, targets, kept)
    l1.backward()
    x2 = full.clone().requires_grad_()
    l2, p2 = torch.compile(loss, backend="aot_eager", fullgraph=True)(x2, targets, kept)
    l2.backward()
    assert_bitwise(p1.detach(), p2.detach())
    assert_bitwise(x1.grad, x2.grad)


@pytest.fixture(scope="module", params=[2, 4])
def ranks(request, tmp_path_factory):
    import kept_sets_worker

    return run_workers(kept_sets_worker.main, tmp_path_factory.mktemp(f"kept{request.param}"),
                       request.param, TIMEOUT_S)[0]


def test_tp_over_gloo_gives_the_tp1_bits_and_disagreement_fails_together(ranks):
    for rank, res in enumerate(ranks):
        for case in ("tp", "after"):
            got, ref = res[case], res["reference"]
            assert "error" not in got, (rank, case, got.get("error"))
            assert_bitwise(got["logp"], ref["logp"], f"{case} logp rank {rank}")
            assert_bitwise(got["entropy"], ref["entropy"], f"{case} entropy rank {rank}")
            assert_bitwise(got["grad"], ref["grad"], f"{case} grad rank {rank}")
        got = res["different sets"]
        assert "kept sets" in got.get("error", ""), got
        assert got["field"] == "kept_ids"


def _fused_inputs(stream=3, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(stream)
    hidden = (torch.randn(6, 24, generator=gen)).to(dtype)
    weight = (torch.randn(PADDED, 24, generator=gen) * 0.5).to(dtype)
    targets = torch.randint(0, REAL, (6,), generator=gen)
    return hidden, weight, targets, kept_sets(targets, gen, 50, REAL)


@pytest.mark.parametrize("compiled", [False, True])
def test_fused_equals_the_logits_call_on_linear_logits(compiled):
    from detlogp.torch import fused_linear_logprobs, linear_logits

    hidden, weight, targets, kept = _fused_inputs()
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()

    def fused(h, w, t, k):
        return fused_linear_logprobs(h, w, t, real_vocab=REAL, entropy=True, tile_width=128,
                                     kept_ids=k, softcap=6.0)

    fn = torch.compile(fused, backend="aot_eager", fullgraph=True) if compiled else fused
    logp, lse, ent = fn(h, w, targets, kept)
    (logp.sum() + lse.sum() + 0.5 * ent.sum()).backward()
    z = linear_logits(hidden, weight).requires_grad_()
    l_logp, l_ent = vocab_parallel_logprobs(z, targets, real_vocab=REAL, entropy=True,
                                            tile_width=128, kept_ids=kept, softcap=6.0)
    assert_bitwise(logp.detach(), l_logp.detach())
    assert_bitwise(ent.detach(), l_ent.detach())
    # Only the weight rows of kept ids get a gradient.
    kept_rows = torch.zeros(PADDED, dtype=torch.bool)
    kept_rows[kept[kept >= 0]] = True
    assert torch.equal(bits(w.grad[~kept_rows]), torch.zeros_like(bits(w.grad[~kept_rows])))
    assert (w.grad[kept_rows].float().abs().sum(1) > 0).all()
    assert torch.isfinite(h.grad.float()).all()


def test_fused_numpy_and_errors():
    from detlogp.torch import fused_linear_logprobs

    hidden, weight, targets, kept = _fused_inputs(dtype=torch.float32)
    want = fused_linear_logprobs(hidden, weight, targets, real_vocab=REAL, kept_ids=kept)
    got = fused_linear_logprobs(hidden.numpy(), weight.numpy(), targets.numpy(), real_vocab=REAL,
                                kept_ids=kept.numpy())
    assert_bitwise(want[0], torch.from_numpy(got[0]))
    bad = kept.clone()
    bad[4] = torch.where(bad[4] == targets[4], -1, bad[4])
    with pytest.raises(LogprobContractError) as info:
        fused_linear_logprobs(hidden, weight, targets, real_vocab=REAL, kept_ids=bad)
    assert info.value.field == "kept_ids" and "row 4: target id" in str(info.value)
    logp, _ = fused_linear_logprobs(hidden, weight, targets, real_vocab=REAL, kept_ids=bad,
                                    outside_kept="neg_inf")
    assert logp[4].item() == float("-inf")
    with pytest.raises(LogprobContractError, match="targets' shape"):
        fused_linear_logprobs(hidden, weight, targets, real_vocab=REAL, kept_ids=kept[:3])


def test_opcheck_fused_with_kept_ids():
    hidden, weight, targets, kept = _fused_inputs(dtype=torch.float32)
    args = (hidden.requires_grad_(), weight.requires_grad_(), targets, "", REAL, "", True, 1.0,
            64, -100, True, None, "", None, None, None, None, None, False, kept, False)
    torch.library.opcheck(_ops.fused_linear_logprobs, args)
