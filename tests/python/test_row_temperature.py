"""Per-token temperatures from Python: temperature= a tensor of the targets' shape on
vocab_parallel_logprobs and fused_linear_logprobs. Each token gets the bits of the scalar call
with its own temperature (logp, entropy and the gradients), through N-D logits and the causal
shift's strided view (the temperature travels with its token); bad tensors and values raise
LogprobContractError naming the temperature."""

import pytest
import torch

from detlogp import LogprobContractError
from detlogp.torch import fused_linear_logprobs, vocab_parallel_logprobs

REAL, PADDED, W = 1000, 1024, 64
TEMPS = (0.7, 1.0, 1.9)


def run(logits, targets, temperature, softcap):
    x = logits.detach().clone().requires_grad_(True)
    logp, ent = vocab_parallel_logprobs(x, targets, real_vocab=REAL, temperature=temperature,
                                        entropy=True, tile_width=W, softcap=softcap)
    (logp.sum() + 0.5 * ent.sum()).backward()
    return logp.detach(), ent.detach(), x.grad


def bits(t):
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("softcap", [None, 8.0])
@pytest.mark.parametrize("view", ["contiguous", "shift", "transposed"])
def test_each_token_equals_the_scalar_call_with_its_temperature(dtype, softcap, view):
    gen = torch.Generator().manual_seed(7)
    full = (torch.randn(3, 6, PADDED, generator=gen) * 10).to(dtype)
    targets = torch.randint(0, REAL, (3, 6), generator=gen)
    if view == "shift":  # the causal shift: rows with holes
        logits, targets = full[:, :-1], targets[:, 1:]
    elif view == "transposed":  # [b, s] read from Megatron's [s, b] buffer
        logits = full.transpose(0, 1).contiguous().transpose(0, 1)
    else:
        logits = full
    temps = torch.tensor(TEMPS)[torch.randint(0, len(TEMPS), targets.shape, generator=gen)]
    logp, ent, grad = run(logits, targets, temps, softcap)
    for tau in TEMPS:
        s_logp, s_ent, s_grad = run(logits, targets, tau, softcap)
        rows = temps == tau
        assert rows.any()
        assert torch.equal(bits(logp[rows]), bits(s_logp[rows]))
        assert torch.equal(bits(ent[rows]), bits(s_ent[rows]))
        assert torch.equal(bits(grad[rows][:, :REAL]), bits(s_grad[rows][:, :REAL]))
    # The temperatures matter: not the call at temperature 1.
    assert not torch.equal(bits(logp), bits(run(logits, targets, 1.0, softcap)[0]))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_values_raise_naming_the_temperature(bad):
    x = torch.randn(4, PADDED)
    t = torch.randint(0, REAL, (4,))
    temps = torch.tensor([1.0, 0.5, bad, 2.0])
    with pytest.raises(LogprobContractError) as info:
        vocab_parallel_logprobs(x, t, real_vocab=REAL, temperature=temps, tile_width=W)
    assert info.value.field == "temperature"
    assert "temperature of row 2" in str(info.value)


def test_bad_tensors_raise():
    x = torch.randn(4, PADDED)
    t = torch.randint(0, REAL, (4,))
    with pytest.raises(LogprobContractError, match="targets' shape"):
        vocab_parallel_logprobs(x, t, real_vocab=REAL, temperature=torch.ones(5))
    with pytest.raises(LogprobContractError, match="floating-point tensor"):
        vocab_parallel_logprobs(x, t, real_vocab=REAL, temperature=torch.ones(4, dtype=torch.int64))


@pytest.mark.parametrize("softcap", [None, 4.0])
def test_fused_each_token_equals_the_scalar_call_with_its_temperature(softcap):
    gen = torch.Generator().manual_seed(11)
    hidden = torch.randn(9, 16, generator=gen).to(torch.bfloat16)
    weight = torch.randn(PADDED, 16, generator=gen).to(torch.bfloat16)
    targets = torch.randint(0, REAL, (9,), generator=gen)
    temps = torch.tensor(TEMPS)[torch.arange(9) % len(TEMPS)]

    def fused(temperature):
        h = hidden.clone().requires_grad_(True)
        logp, lse, ent = fused_linear_logprobs(h, weight, targets, real_vocab=REAL,
                                               entropy=True, temperature=temperature,
                                               tile_width=W, softcap=softcap)
        (logp.sum() + lse.sum() + ent.sum()).backward()
        return logp.detach(), lse.detach(), ent.detach(), h.grad

    got = fused(temps)
    for tau in TEMPS:
        want = fused(tau)
        rows = temps == tau
        for g, w in zip(got, want):
            assert torch.equal(bits(g[rows]), bits(w[rows]))
    # A NumPy array of temperatures is the same call.
    assert torch.equal(bits(fused(temps.numpy())[0]), bits(got[0]))
    with pytest.raises(LogprobContractError) as info:
        fused(torch.tensor([1.0] * 8 + [float("nan")]))
    assert info.value.field == "temperature"
