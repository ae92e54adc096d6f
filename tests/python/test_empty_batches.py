"""An empty micro-batch (no tokens: (0, s, v) or (b, 0, v) logits, [0, H] hidden states)
gives empty outputs and empty gradients on every entry point, as torch does (RL data loaders
produce them). At TP > 1 the ranks still agree first (test_layouts.py)."""

import numpy as np
import pytest
import torch

import detlogp
import detlogp.torch as dt

V = 1000
SHAPES = [(0, 16, V), (4, 0, V), (0, V)]


def _torch_reference(x, t):
    """What torch gives: log_softmax + gather, and its gradient."""
    leaf = x.detach().clone().requires_grad_()
    logp = torch.log_softmax(leaf.float(), -1).gather(-1, t.unsqueeze(-1)).squeeze(-1)
    logp.sum().backward()
    return logp, leaf.grad


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("entry", ["vocab_parallel_logprobs", "logprobs_from_logits",
                                   "vocab_parallel_cross_entropy",
                                   "vocab_parallel_log_probs_from_logits"])
def test_empty_logits_give_empty_outputs_and_gradients(shape, entry):
    x = torch.randn(shape, dtype=torch.bfloat16, requires_grad=True)
    t = torch.zeros(shape[:-1], dtype=torch.long)
    out = getattr(dt, entry)(x, t)
    ref, ref_grad = _torch_reference(x, t)
    assert out.shape == ref.shape == shape[:-1] and out.dtype == torch.float32
    out.sum().backward()
    assert x.grad.shape == ref_grad.shape == shape and x.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("entry", ["entropy_from_logits", "vocab_parallel_entropy"])
def test_empty_logits_give_empty_entropy_and_gradient(shape, entry):
    x = torch.randn(shape, dtype=torch.bfloat16, requires_grad=True)
    out = getattr(dt, entry)(x)
    assert out.shape == shape[:-1] and out.dtype == torch.float32
    out.sum().backward()
    assert x.grad.shape == shape and x.grad.dtype == torch.bfloat16


def test_empty_with_entropy_mask_and_contract():
    x = torch.randn(0, 7, 128)
    mask = torch.ones(0, 7)
    logp, ent, contract = dt.vocab_parallel_logprobs(x, torch.zeros(0, 7, dtype=torch.long),
                                                     loss_mask=mask, entropy=True,
                                                     return_contract=True)
    assert logp.shape == ent.shape == (0, 7)
    assert contract is None  # no contract describes zero tokens
    with torch.no_grad():
        assert dt.vocab_parallel_logprobs(x, torch.zeros(0, 7, dtype=torch.long)).shape == (0, 7)


def test_empty_inputs_are_still_checked():
    with pytest.raises(detlogp.LogprobContractError, match="targets must have the logits' "
                                                           "leading shape"):
        dt.vocab_parallel_logprobs(torch.randn(0, 7, 128), torch.zeros(0, 6, dtype=torch.long))
    with pytest.raises(detlogp.LogprobContractError, match="dtype torch.float64"):
        dt.vocab_parallel_logprobs(torch.randn(0, 7, 128, dtype=torch.float64),
                                   torch.zeros(0, 7, dtype=torch.long))


@pytest.mark.parametrize("entropy", [False, True])
def test_fused_lm_head_without_tokens(entropy):
    hidden = torch.randn(0, 16, requires_grad=True)
    weight = torch.randn(256, 16, requires_grad=True)
    outs = detlogp.fused_linear_logprobs(hidden, weight, torch.zeros(0, dtype=torch.long),
                                         entropy=entropy)
    assert len(outs) == (3 if entropy else 2)
    assert all(o.shape == (0,) and o.dtype == torch.float32 for o in outs)
    sum(o.sum() for o in outs).backward()
    assert hidden.grad.shape == (0, 16)
    assert weight.grad.shape == (256, 16) and not weight.grad.any()  # as torch: zero
    logp, lse = detlogp.fused_linear_logprobs(hidden.detach().numpy(), weight.detach().numpy(),
                                              np.zeros(0, dtype=np.int64))
    assert isinstance(logp, np.ndarray) and logp.shape == lse.shape == (0,)
