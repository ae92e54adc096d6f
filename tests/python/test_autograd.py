"""torch.autograd through logp, LSE and entropy: gradients against float64 autograd of the
same loss, in the logits dtype; partial gradients; no copy of the logits."""

import numpy as np
import pytest
import torch

import detlogp
from helpers import TORCH_DTYPES, assert_bitwise, contract, problem

REAL, PADDED, W = 1000, 1024, 64


def float64_grad(x, t, mask, weights, temperature=1.0):
    """d/dx of sum(w0*logp + w1*lse + w2*entropy) in float64 torch (padding columns: 0)."""
    z = x.double().clone().requires_grad_()
    zz = z[:, :REAL] / temperature
    logsm = torch.log_softmax(zz, -1)
    m = torch.tensor(mask, dtype=torch.float64)
    safe = torch.where(torch.tensor(mask), t, torch.zeros_like(t))
    logp = logsm.gather(1, safe[:, None])[:, 0] * m
    lse = torch.logsumexp(zz, -1)
    ent = -(logsm.exp() * logsm).sum(-1)
    terms = [logp, lse, ent]
    loss = sum(w.double() * v for w, v in zip(weights, terms) if w is not None).sum()
    loss.backward()
    return z.grad


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("which", ["logp", "lse", "entropy", "all"])
def test_gradients_match_float64_autograd(dtype, which):
    x, t, mask = problem(stream=21)
    xd = x.to(TORCH_DTYPES[dtype])
    temperature = 0.8 if which == "all" else 1.0
    c = contract(len(t), REAL, PADDED, mask=mask, dtype=dtype, tile_width=W,
                 temperature=temperature)
    op, _ = detlogp.get_logprob_op(c)
    g = torch.Generator().manual_seed(1)
    w = [torch.randn(len(t), generator=g) for _ in range(3)]
    use = {"logp": [0], "lse": [1], "entropy": [2], "all": [0, 1, 2]}[which]
    weights = [w[i] if i in use else None for i in range(3)]
    xg = xd.clone().requires_grad_()
    outs = op(xg, t, contract=c, entropy=True)
    assert all(o.requires_grad for o in outs)
    loss = sum((wi * o).sum() for wi, o in zip(weights, outs) if wi is not None)
    loss.backward()
    assert xg.grad.dtype == xd.dtype and xg.grad.shape == xd.shape
    expect = float64_grad(xd.float(), t, mask, weights, c.temperature)
    got = xg.grad.double()
    if dtype == "fp32":
        assert (got - expect).abs().max() <= 1e-5  # the fp32 gradient tolerance
    else:
        # computed in fp32 and rounded once to the logits dtype: within one ulp of it
        ulp = {"bf16": 2.0**-7, "fp16": 2.0**-10}[dtype]
        assert ((got - expect).abs() <= expect.abs() * ulp + 1e-6).all()
    assert_bitwise(xg.grad[:, REAL:], torch.zeros(len(t), PADDED - REAL, dtype=xd.dtype),
                   "padding columns get exactly +0")
    if which == "logp":  # inactive rows get no logp gradient
        inactive = [i for i, a in enumerate(mask) if not a]
        assert (xg.grad[inactive] == 0).all()
    if which == "lse":  # the LSE gradient flows on inactive rows too
        inactive = [i for i, a in enumerate(mask) if not a]
        assert (xg.grad[inactive, :REAL] != 0).any()


def test_entropy_false_two_outputs_and_grad_through_logp_only():
    x, t, mask = problem(stream=2)
    c = contract(len(t), REAL, PADDED, mask=mask, tile_width=W)
    op, _ = detlogp.get_logprob_op(c)
    xg = x.clone().requires_grad_()
    out = op(xg, t, contract=c)
    assert len(out) == 2
    out[0].sum().backward()  # lse receives no gradient: passed to C++ as "not supplied"
    expect = float64_grad(x, t, mask, [torch.ones(len(t)), None, None])
    assert (xg.grad.double() - expect).abs().max() <= 1e-5


def test_no_autograd_when_not_needed():
    x, t, mask = problem(stream=3)
    c = contract(len(t), REAL, PADDED, mask=mask, tile_width=W)
    op, _ = detlogp.get_logprob_op(c)
    logp, lse = op(x, t, contract=c)
    assert not logp.requires_grad and logp.grad_fn is None
    xg = x.clone().requires_grad_()
    with torch.no_grad():
        logp2, _ = op(xg, t, contract=c)
    assert not logp2.requires_grad
    assert_bitwise(logp, logp2)


def test_non_leaf_logits_and_chain_rule():
    """Logits produced by a matmul (the usual LM head): the gradient flows to the weights."""
    g = torch.Generator().manual_seed(4)
    h = torch.randn(9, 16, generator=g, dtype=torch.float64)
    wt = (torch.randn(16, PADDED, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    t = torch.randint(0, REAL, (9,), generator=g)
    c = contract(9, REAL, PADDED, tile_width=W)
    op, _ = detlogp.get_logprob_op(c)
    logits = (h @ wt).float()
    logp, lse = op(logits, t, contract=c)
    (logp.sum() - 0.1 * lse.sum()).backward()
    got = wt.grad.clone()
    wt.grad = None
    z = (h @ wt)[:, :REAL]
    ls = torch.log_softmax(z, -1)
    (ls.gather(1, t[:, None]).sum() - 0.1 * torch.logsumexp(z, -1).sum()).backward()
    assert (got - wt.grad).abs().max() <= 1e-4


def test_no_copy_backward_reads_the_callers_buffer():
    x, t, mask = problem(stream=5, inactive=())
    c = contract(len(t), REAL, PADDED, tile_width=W)
    op, _ = detlogp.get_logprob_op(c)
    xs = x.clone()
    f = op.forward(xs, t, contract=c)
    assert f.saved_logits_data_ptr == xs.data_ptr()
    lse = f.lse.clone()
    ones = torch.ones(len(t))
    before = f.backward(grad_lse=ones)  # softmax(x)
    # Changing the logits in place between forward and backward is visible to backward
    # (it reads the caller's buffer, never a copy): the documented contract is "keep the
    # logits unchanged until backward".
    xs[:, :REAL] += 1.0
    after = f.backward(grad_lse=ones)
    assert not torch.equal(before, after)
    expect = torch.exp(xs[:, :REAL].double() - lse.double()[:, None])  # exp(z_new - lse_old)
    assert (after[:, :REAL].double() - expect).abs().max() <= 1e-5


def test_autograd_refuses_backward_after_an_in_place_change():
    x, t, mask = problem(stream=6)
    c = contract(len(t), REAL, PADDED, mask=mask, tile_width=W)
    op, _ = detlogp.get_logprob_op(c)
    leaf = x.clone().requires_grad_()
    logits = leaf * 1.0  # a non-leaf that can be modified in place
    logp, lse = op(logits, t, contract=c)
    with torch.no_grad():
        logits.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        logp.sum().backward()


def test_logits_stay_alive_while_the_graph_needs_them():
    x, t, mask = problem(stream=8)
    c = contract(len(t), REAL, PADDED, mask=mask, tile_width=W)
    op, _ = detlogp.get_logprob_op(c)
    xg = x.clone().requires_grad_()
    logp, _ = op(xg * 2.0, t, contract=c)  # the only reference to the logits is the graph's
    for _ in range(3):
        torch.randn(64, PADDED) * 2.0  # churn the allocator
    logp.sum().backward()
    expect = 2.0 * float64_grad(2.0 * x, t, mask, [torch.ones(len(t)), None, None])
    assert (xg.grad.double() - expect).abs().max() <= 2e-5
    # NumPy: the forward result holds the array
    xn = (x * 2.0).numpy()
    f = op.forward(xn, t.numpy(), contract=c)
    assert f._handle.logits_owner is xn
    assert np.isfinite(f.backward(grad_logp=np.ones(len(t), np.float32))).all()
