"""The fused lm_head from Python: bitwise equal to the operator on linear_logits, autograd into
hidden states and weight against float64 autograd of hidden @ W.T -> log_softmax -> gather,
NumPy input, and clear errors."""

import numpy as np
import pytest
import torch

import detlogp
from helpers import TORCH_DTYPES, assert_bitwise, contract

REAL, PADDED, W, H, N = 200, 256, 32, 40, 9


def make(dtype, salt=0):
    g = torch.Generator().manual_seed(salt)
    hidden = torch.randn(N, H, generator=g).to(TORCH_DTYPES[dtype])
    weight = (torch.randn(PADDED, H, generator=g) * 0.5).to(TORCH_DTYPES[dtype])
    weight[REAL:] = 3e4  # padding rows: never read
    targets = torch.randint(0, REAL, (N,), generator=g)
    targets[3] = -100  # an inactive token
    return hidden, weight, targets


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_fused_equals_the_operator_on_linear_logits(dtype):
    hidden, weight, targets = make(dtype, 1)
    mask = [bool(t != -100) for t in targets]
    c = contract(N, REAL, PADDED, dtype=dtype, tile_width=W, mask=mask)
    logp, lse, ent = detlogp.fused_linear_logprobs(hidden, weight, targets, contract=c,
                                                   entropy=True)
    z = detlogp.linear_logits(hidden, weight)
    assert z.dtype == torch.float32 and z.shape == (N, PADDED)
    op, _ = detlogp.get_logprob_op(contract(N, REAL, PADDED, dtype="fp32", tile_width=W,
                                            mask=mask))
    want = op(z, targets, contract=contract(N, REAL, PADDED, dtype="fp32", tile_width=W,
                                            mask=mask), entropy=True)
    for a, b, name in zip(want, (logp, lse, ent), ("logp", "lse", "entropy")):
        assert_bitwise(a, b, name)
    # The default contract (even shards, ignore_index -> inactive) is the same contract here.
    again = detlogp.fused_linear_logprobs(hidden, weight, targets, real_vocab=REAL,
                                          tile_width=W, entropy=True)
    for a, b in zip(again, (logp, lse, ent)):
        assert_bitwise(a, b)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_autograd_matches_float64(dtype):
    hidden, weight, targets = make(dtype, 2)
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    logp, lse, ent = detlogp.fused_linear_logprobs(h, w, targets, real_vocab=REAL, tile_width=W,
                                                   entropy=True)
    g = torch.Generator().manual_seed(3)
    coef = [torch.randn(N, generator=g) for _ in range(3)]
    (coef[0] * logp + coef[1] * lse + coef[2] * ent).sum().backward()
    assert h.grad.dtype == hidden.dtype and w.grad.dtype == weight.dtype

    hd = hidden.double().requires_grad_()
    wd = weight.double().requires_grad_()
    z = hd @ wd[:REAL].T
    logsm = torch.log_softmax(z, -1)
    active = targets != -100
    safe = torch.where(active, targets, torch.zeros_like(targets))
    lp = logsm.gather(1, safe[:, None])[:, 0] * active
    ls = torch.logsumexp(z, -1)
    en = -(logsm.exp() * logsm).sum(-1)
    (coef[0].double() * lp + coef[1].double() * ls + coef[2].double() * en).sum().backward()
    tol = 1e-5 if dtype == "fp32" else 1e-2  # bf16: the gradients are rounded to bf16 once
    np.testing.assert_allclose(lp.detach().numpy(), logp.detach().numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(hd.grad.numpy(), h.grad.double().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(wd.grad.numpy(), w.grad.double().numpy(), rtol=tol, atol=tol)
    assert torch.all(w.grad[REAL:] == 0), "padding rows get exactly zero"


def test_only_the_weight_requires_grad():
    hidden, weight, targets = make("fp32", 4)
    w = weight.clone().requires_grad_()
    logp, lse = detlogp.fused_linear_logprobs(hidden, w, targets, real_vocab=REAL, tile_width=W)
    logp.sum().backward()
    assert w.grad is not None and hidden.grad is None


def test_numpy_inputs_give_numpy_outputs():
    hidden, weight, targets = make("fp32", 5)
    logp, lse = detlogp.fused_linear_logprobs(hidden.numpy(), weight.numpy(), targets.numpy(),
                                              real_vocab=REAL, tile_width=W)
    assert isinstance(logp, np.ndarray) and logp.shape == (N,)
    t_logp, t_lse = detlogp.fused_linear_logprobs(hidden, weight, targets, real_vocab=REAL,
                                                  tile_width=W)
    assert_bitwise(t_logp.numpy(), logp)
    assert_bitwise(t_lse.numpy(), lse)


def test_every_kernel_gives_the_same_bits():
    hidden, weight, targets = make("bf16", 6)
    names = detlogp.fused_kernel_names()
    assert names[0] == "scalar-reference" and len(names) >= 2
    outs = [detlogp.fused_linear_logprobs(hidden, weight, targets, real_vocab=REAL, tile_width=W,
                                          kernel=k) for k in names]
    for k, o in zip(names[1:], outs[1:]):
        assert_bitwise(outs[0][1], o[1], k)


def test_bad_inputs_raise_contract_errors():
    hidden, weight, targets = make("fp32", 7)
    with pytest.raises(detlogp.LogprobContractError, match="columns"):
        detlogp.fused_linear_logprobs(hidden, weight[:, :-1], targets, real_vocab=REAL,
                                      tile_width=W)
    with pytest.raises(detlogp.LogprobContractError, match="dtype"):
        detlogp.fused_linear_logprobs(hidden.bfloat16(), weight, targets, real_vocab=REAL,
                                      tile_width=W)
    with pytest.raises(detlogp.LogprobContractError, match="not available"):
        detlogp.fused_linear_logprobs(hidden, weight, targets, kernel="no-such-kernel")


def test_the_functional_torch_api_re_exports_the_fused_op():
    import detlogp.torch as dt
    assert dt.fused_linear_logprobs is detlogp.fused_linear_logprobs
    assert dt.linear_logits is detlogp.linear_logits


@pytest.mark.parametrize("threads", [-1, 4097])
def test_a_thread_count_out_of_range_is_refused(threads):
    hidden, weight, targets = make("fp32", 8)
    with pytest.raises(detlogp.LogprobContractError,
                       match=rf"threads must be 0 \(all hardware threads\) or a count up to "
                             rf"4096; got {threads}"):
        detlogp.fused_linear_logprobs(hidden, weight, targets, real_vocab=REAL, threads=threads)


@pytest.mark.parametrize("grad_on", ["weight", "hidden"])
def test_numpy_next_to_a_tensor_that_requires_grad_is_refused(grad_on):
    hidden, weight, targets = make("fp32", 9)
    if grad_on == "weight":
        hidden, weight = hidden.numpy(), weight.requires_grad_()
        other = "hidden"
    else:
        hidden, weight = hidden.requires_grad_(), weight.numpy()
        other = "weight"
    with pytest.raises(detlogp.LogprobContractError,
                       match=rf"{grad_on} is a torch tensor that requires grad but {other} is a "
                             rf"NumPy array: its gradient would never be set. Pass {other} as a "
                             rf"torch tensor \(torch.from_numpy\({other}\)"):
        detlogp.fused_linear_logprobs(hidden, weight, targets, real_vocab=REAL)
    # Without a gradient to lose (no_grad), the mix still runs.
    with torch.no_grad():
        logp, _ = detlogp.fused_linear_logprobs(hidden, weight, targets, real_vocab=REAL)
    assert np.isfinite(np.asarray(logp)).all()
