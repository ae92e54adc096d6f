"""The logit softcap from Python: softcap= on vocab_parallel_logprobs and
fused_linear_logprobs, against float64 autograd of cap * tanh(x / cap) / T -> log_softmax ->
gather; the C++ in-process TP group gives the Python TP=1 bits; the contract and capability
fields; bad caps raise LogprobContractError naming the field."""

import math

import numpy as np
import pytest
import torch

import detlogp
from detlogp.torch import vocab_parallel_logprobs
from detlogp import LogprobContractError, _detlogp
from helpers import TORCH_DTYPES, assert_bitwise, contract, problem

REAL, PADDED, W = 1000, 1024, 64
CAP = 30.0


def capped_reference(x, t, cap, temperature):
    """float64 logp, entropy and the logp gradient (all-ones upstream) of the exactly capped
    logits."""
    xd = x[:, :REAL].double().requires_grad_(True)
    z = cap * torch.tanh(xd / cap) / temperature
    lsm = torch.log_softmax(z, dim=-1)
    logp = lsm.gather(1, t.clamp(min=0)[:, None])[:, 0]
    ent = -(lsm.exp() * lsm).sum(-1)
    logp.sum().backward()
    return logp.detach(), ent.detach(), xd.grad


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_softcap_agrees_with_float64(dtype, temperature):
    x, t, _ = problem(real=REAL, padded=PADDED, scale=25.0, inactive=())
    xd = x.to(TORCH_DTYPES[dtype]).requires_grad_(True)
    logp, ent = vocab_parallel_logprobs(
        xd, t, real_vocab=REAL, temperature=temperature, softcap=CAP, entropy=True,
        tile_width=W)
    logp.sum().backward()
    e_logp, e_ent, e_grad = capped_reference(xd.detach().float(), t, CAP, temperature)
    # numerics.md "Accuracy of logp": 1e-5 + 6 * 2^-23 cap / T on top of the LSE's roundings.
    bound = 1e-5 + 6 * 2.0 ** -23 * CAP / temperature + 1e-5
    assert (logp.double() - e_logp).abs().max() <= bound
    assert (ent.double() - e_ent).abs().max() <= bound
    half_ulp = 2.0 ** -8 if dtype == "bf16" else 2.0 ** -23  # relative: half an ulp at most
    g = xd.grad[:, :REAL].double()
    err = (g - e_grad).abs() - (1e-5 + half_ulp * e_grad.abs())
    assert err.max() <= 0, (err.max().item(), g.flatten()[err.argmax()].item(), e_grad.flatten()[err.argmax()].item())
    assert (xd.grad[:, REAL:].float() == 0).all()
    # The cap changes the result: without it the rows' LSEs are set by logits far above 30.
    plain = vocab_parallel_logprobs(xd.detach(), t, real_vocab=REAL,
                                                  temperature=temperature, tile_width=W)
    assert (plain - logp.detach()).abs().max() > 1.0


def test_no_softcap_is_todays_path_and_the_contract_carries_the_cap():
    x, t, _ = problem(real=REAL, padded=PADDED)
    a, ca = vocab_parallel_logprobs(x, t, real_vocab=REAL, return_contract=True)
    b, cb = vocab_parallel_logprobs(x, t, real_vocab=REAL, softcap=None,
                                                  return_contract=True)
    c, cc = vocab_parallel_logprobs(x, t, real_vocab=REAL, softcap=CAP,
                                                  return_contract=True)
    assert_bitwise(a, b, "softcap=None")
    assert ca.softcap is None and cc.softcap == CAP
    assert "softcap" not in ca.to_dict() and cc.to_dict()["softcap"] == CAP
    assert ca.cross_rank_fingerprint() == cb.cross_rank_fingerprint()
    assert ca.cross_rank_fingerprint() != cc.cross_rank_fingerprint()
    assert cc.replace(softcap=None).cross_rank_fingerprint() == ca.cross_rank_fingerprint()
    assert not torch.equal(a, c)


@pytest.mark.parametrize("tp,bounds", [(2, [(0, 512), (512, 1024)]),
                                       (4, [(0, 192), (192, 512), (512, 896), (896, 1024)])])
def test_cpp_in_process_tp_gives_the_python_tp1_bits(tp, bounds):
    x, t, mask = problem(real=REAL, padded=PADDED, stream=5, scale=25.0)
    c1 = contract(len(t), REAL, PADDED, mask=mask, tile_width=W, softcap=CAP, temperature=0.7)
    op = detlogp.get_logprob_op(c1).op
    logp, lse, ent = op(x, t, contract=c1, entropy=True)
    contracts = [contract(len(t), REAL, PADDED, bounds=bounds, rank=r, mask=mask, tile_width=W,
                          softcap=CAP, temperature=0.7) for r in range(tp)]
    shards = [x[:, s:e] for s, e in bounds]
    per_rank = _detlogp.in_process_forward(
        op=op._cpp, dtype="fp32",
        shards=[(s.data_ptr(), s.shape[0], s.shape[1], s.stride(0)) for s in shards],
        contracts=[k._cpp for k in contracts], targets=t.numpy(), deterministic=True,
        entropy=True)
    for r, (lp, ls, en) in enumerate(per_rank):
        assert_bitwise(lp, logp.numpy(), f"rank {r} logp")
        assert_bitwise(ls, lse.numpy(), f"rank {r} lse")
        assert_bitwise(en, ent.numpy(), f"rank {r} entropy")


@pytest.mark.parametrize("bad", [0, -0.0, -1.0, math.inf, -math.inf, math.nan])
def test_bad_caps_name_the_field_and_value(bad):
    x, t, _ = problem(real=REAL, padded=PADDED)
    with pytest.raises(LogprobContractError) as e:
        vocab_parallel_logprobs(x, t, real_vocab=REAL, softcap=bad)
    assert e.value.field == "softcap" and e.value.code == "out_of_range"
    assert "softcap must be a finite number > 0" in str(e.value)


@pytest.mark.parametrize("bad", ["30", True, [30.0]])
def test_caps_of_the_wrong_type_are_refused(bad):
    with pytest.raises(LogprobContractError, match="softcap must be None or a finite number"):
        contract(2, REAL, PADDED, softcap=bad)


def test_capability_field():
    cap = detlogp.LogprobBackendCapability(
        backend_id="no-cap", roles=["train"], dtypes=["fp32"], supports_vocab_padding=True,
        mask_modes=["explicit_active_mask"], exports_vocab_lse=True,
        determinism_scopes=["cross_tp_bitwise"])
    assert cap.supports_softcap is False and cap.to_dict()["supports_softcap"] is False
    c = contract(2, REAL, PADDED, softcap=CAP)
    assert cap.incompatibilities(c) == ("softcap=30 is unsupported",)
    assert cap.supports(contract(2, REAL, PADDED))
    with_cap = detlogp.LogprobBackendCapability(**{**cap._kwargs(), "supports_softcap": True})
    assert with_cap.supports(c) and with_cap.supports_softcap


def test_fused_softcap_equals_the_operator_on_linear_logits():
    n, real, padded, h = 9, 200, 256, 40
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(n, h, generator=g)
    weight = torch.randn(padded, h, generator=g)
    targets = torch.randint(0, real, (n,), generator=g)
    logp, lse = detlogp.fused_linear_logprobs(hidden, weight, targets, real_vocab=real,
                                              softcap=2.0, tile_width=32)
    z = detlogp.linear_logits(hidden, weight)
    c = contract(n, real, padded, tile_width=32, softcap=2.0)
    want_logp, want_lse = detlogp.get_logprob_op(c).op(z, targets, contract=c)
    assert_bitwise(want_logp, logp, "logp")
    assert_bitwise(want_lse, lse, "lse")
    plain = detlogp.fused_linear_logprobs(hidden, weight, targets, real_vocab=real,
                                          tile_width=32)
    assert not np.array_equal(np.asarray(plain[1]), np.asarray(lse))
    with pytest.raises(LogprobContractError, match="softcap"):
        detlogp.fused_linear_logprobs(hidden, weight, targets, contract=c, softcap=2.0)
