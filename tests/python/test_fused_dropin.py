"""``detlogp.torch.fused_vocab_parallel_logprobs``: the fused lm_head as a one-line swap for
``vocab_parallel_logprobs(hidden @ W.T, ...)``.

- logp and entropy are bit for bit those of ``vocab_parallel_logprobs`` on the canonical logits
  ``linear_logits(hidden, W)`` read through the same view, for [B, S, H] hidden states, the
  causal shift ``hidden[:, :-1]`` and Megatron's [S, B, H] read as [B, S, H], with loss_mask,
  ignore_index, per-token temperatures, softcap and entropy, fp32 and bf16;
- the gradients: of the hidden states within fp32 rounding of the logits path's gradient
  mapped back through the matmul (float64), bit for bit those of the same tokens passed as a
  contiguous [tokens, H] batch (the view never changes a bit, grad_weight included); unscored
  tokens get logp +0.0 and no gradient through it;
- TP 1, 2 (even shards, an uneven vocab_start table, a DTensor weight, DTensor hidden states
  and outputs) and 4 over gloo: the same bits of logp, entropy, grad_hidden and each rank's
  rows of grad_weight;
- errors name the field; no tokens give empty outputs; the op under torch.compile and opcheck.
"""

import numpy as np
import pytest
import torch

import detlogp
import detlogp.torch as dt
import fused_dropin_worker as fw
from detlogp import _ops
from helpers import assert_bitwise, bits
from spawn import run_workers

B, S, H, V, REAL = 3, 7, 40, 256, 250
TIMEOUT_S = 300

# How the caller's buffer is viewed: (buffer shape from (B, S), view of a [..., X] tensor).
LAYOUTS = {
    "contiguous": (lambda b, s: (b, s), lambda x: x),
    "causal shift": (lambda b, s: (b, s), lambda x: x[:, :-1]),
    "megatron [s, b]": (lambda b, s: (s, b), lambda x: x.transpose(0, 1)),
}


def _inputs(layout, dtype, salt):
    g = torch.Generator().manual_seed(salt)
    buffer_shape, view = LAYOUTS[layout]
    hidden = torch.randn(*buffer_shape(B, S), H, generator=g).to(dtype)
    weight = (torch.randn(V, H, generator=g) * 0.4).to(dtype)
    weight[REAL:] = 3e4  # padding rows: never read
    lead = tuple(view(hidden).shape[:-1])
    ids = torch.randint(0, REAL, lead, generator=g)
    ids[0, 2] = -100
    mask = (torch.rand(lead, generator=g) > 0.25).float()  # verl's float response_mask
    temps = torch.tensor([0.5, 1.0, 1.7])[torch.randint(0, 3, lead, generator=g)]
    return hidden, weight, view, ids, mask, temps


def _loss(logp, ent):
    coef = torch.linspace(-1, 1, logp.numel()).view(logp.shape)
    return (coef * logp).sum() + 0.3 * ent.sum()


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_token", [False, True])
def test_equals_the_logits_path(layout, dtype, per_token):
    hidden, weight, view, ids, mask, temps = _inputs(layout, dtype, 1 + per_token)
    kwargs = dict(real_vocab=REAL, loss_mask=mask, entropy=True, softcap=20.0,
                  temperature=temps if per_token else 0.8)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, ent = dt.fused_vocab_parallel_logprobs(view(h), w, ids, **kwargs)
    _loss(logp, ent).backward()

    # The logits path on the canonical logits of the same buffer, read through the same view.
    z = detlogp.linear_logits(hidden.reshape(-1, H), weight).view(*hidden.shape[:-1], V)
    z.requires_grad_()
    logp_ref, ent_ref = dt.vocab_parallel_logprobs(view(z), ids, **kwargs)
    _loss(logp_ref, ent_ref).backward()
    assert_bitwise(logp, logp_ref, "logp")
    assert_bitwise(ent, ent_ref, "entropy")

    # The gradient of the logits mapped back through the matmul, in float64.
    zg = z.grad.double()
    want_h = zg @ weight.double()
    want_w = zg.reshape(-1, V).T @ hidden.double().reshape(-1, H)
    tol = 2e-5 if dtype == torch.float32 else 2e-2  # bf16 gradients are rounded to bf16 once
    np.testing.assert_allclose(h.grad.double().numpy(), want_h.numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(w.grad.double().numpy(), want_w.numpy(), rtol=tol, atol=tol)
    assert h.grad.dtype == dtype and w.grad.dtype == dtype
    assert torch.all(w.grad[REAL:] == 0), "padding rows get exactly zero"

    # Unscored tokens: logp +0.0 and no gradient through it (the entropy, as on the logits
    # path, is every token's).
    scored = (mask != 0) & (ids != -100)
    assert bits(logp[~scored]).tolist() == [0] * int((~scored).sum())
    h1 = hidden.clone().requires_grad_()
    dt.fused_vocab_parallel_logprobs(view(h1), weight, ids, **kwargs)[0].sum().backward()
    g1 = view(h1.grad)
    assert torch.all(g1[~scored] == 0) and torch.all(g1[scored].abs().sum(-1) > 0)
    gv = view(h.grad)

    # The same tokens as one contiguous [tokens, H] batch: the same bits, both gradients.
    h2 = view(hidden).reshape(-1, H).clone().requires_grad_()
    w2 = weight.clone().requires_grad_()
    flat = {k: (v.reshape(-1) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    logp2, ent2 = dt.fused_vocab_parallel_logprobs(h2, w2, ids.reshape(-1), **flat)
    _loss(logp2.view(logp.shape), ent2.view(ent.shape)).backward()
    assert_bitwise(logp2, logp.reshape(-1), "logp, contiguous")
    assert_bitwise(h2.grad, gv.reshape(-1, H), "grad_hidden, contiguous")
    assert_bitwise(w2.grad, w.grad, "grad_weight, contiguous")


def test_ignore_index_alone_and_no_ignore_rule():
    hidden, weight, view, ids, _, _ = _inputs("causal shift", torch.float32, 4)
    for ignore_index, t in ((-100, ids), (None, ids.clamp(min=0)),
                            (-1, torch.where(ids == -100, -1, ids))):
        z = detlogp.linear_logits(hidden.reshape(-1, H), weight).view(B, S, V).requires_grad_()
        want = dt.vocab_parallel_logprobs(view(z), t, real_vocab=REAL, ignore_index=ignore_index)
        h = hidden.clone().requires_grad_()
        got = dt.fused_vocab_parallel_logprobs(view(h), weight, t, real_vocab=REAL,
                                               ignore_index=ignore_index)
        assert_bitwise(got, want, f"ignore_index={ignore_index}")
        want.sum().backward()  # without entropy: the op's placeholder output has no gradient
        got.sum().backward()
        np.testing.assert_allclose(h.grad.double().numpy(), (z.grad.double() @ weight.double())
                                   .numpy(), rtol=2e-5, atol=2e-5)


def test_outputs_like_the_logits_path():
    hidden, weight, view, ids, mask, _ = _inputs("causal shift", torch.float32, 5)
    out = dt.fused_vocab_parallel_logprobs(view(hidden), weight, ids, real_vocab=REAL)
    assert isinstance(out, torch.Tensor) and out.shape == ids.shape
    h = hidden.clone().requires_grad_()
    logp, ent, contract = dt.fused_vocab_parallel_logprobs(
        view(h), weight, ids, real_vocab=REAL, entropy=True, entropy_grad=False,
        return_contract=True, loss_mask=mask)
    assert not ent.requires_grad and logp.requires_grad
    assert isinstance(contract, detlogp.LogprobContract)
    assert contract.sharding.real_vocab_size == REAL
    assert contract.mask.active_token_count == int(((mask != 0) & (ids != -100)).sum())
    # vocab_start: this rank's first row, checked against equal shards.
    again = dt.fused_vocab_parallel_logprobs(view(hidden), weight, ids, real_vocab=REAL,
                                             vocab_start=0)
    assert_bitwise(again, out)
    with pytest.raises(detlogp.LogprobContractError, match="vocab_start=5"):
        dt.fused_vocab_parallel_logprobs(view(hidden), weight, ids, vocab_start=5)


def test_no_tokens():
    hidden = torch.randn(2, 0, H).requires_grad_()
    weight = torch.randn(V, H).requires_grad_()
    logp, ent = dt.fused_vocab_parallel_logprobs(hidden, weight, torch.zeros(2, 0,
                                                                             dtype=torch.long),
                                                 entropy=True)
    assert logp.shape == (2, 0) and ent.shape == (2, 0)
    (logp.sum() + ent.sum()).backward()
    assert hidden.grad.shape == hidden.shape and torch.all(weight.grad == 0)


def test_errors_name_the_field():
    hidden, weight, view, ids, mask, temps = _inputs("causal shift", torch.float32, 6)
    cases = [
        (lambda: dt.fused_vocab_parallel_logprobs(view(hidden), weight, ids[:, 1:]),
         r"targets must have the hidden states' leading shape \(3, 6\); got \(3, 5\)"),
        (lambda: dt.fused_vocab_parallel_logprobs(view(hidden), weight[0], ids),
         r"weight must be a torch.Tensor of shape \[local_vocab, H\]; got \(40,\)"),
        (lambda: dt.fused_vocab_parallel_logprobs(view(hidden)[..., :-1], weight, ids),
         "hidden"),
        (lambda: dt.fused_vocab_parallel_logprobs(view(hidden), weight, ids, loss_mask=mask.T),
         r"loss_mask must have the targets' shape \(3, 6\); got \(6, 3\)"),
        (lambda: dt.fused_vocab_parallel_logprobs(view(hidden), weight, ids,
                                                  temperature=temps[:, 1:]),
         r"temperature tensor must have the targets' shape \(3, 6\)"),
        (lambda: dt.fused_vocab_parallel_logprobs(view(hidden), weight.double(), ids),
         "weight"),
        (lambda: dt.fused_vocab_parallel_logprobs(view(hidden), weight.bfloat16(), ids),
         "dtype"),
        (lambda: dt.fused_vocab_parallel_logprobs(view(hidden), weight, ids, real_vocab=V + 1),
         r"real_vocab=257 is larger than the vocabulary the lm_head weight shards hold: 256 "
         r"columns \(weight.shape\[0\]\)"),
        (lambda: dt.fused_vocab_parallel_logprobs(view(hidden), weight, ids, entropy=1),
         "entropy"),
        (lambda: dt.fused_vocab_parallel_logprobs(view(hidden).numpy(), weight, ids),
         "hidden must be a torch.Tensor"),
        (lambda: dt.fused_vocab_parallel_logprobs(view(hidden), weight, ids + REAL),
         "target"),
    ]
    for i, (fn, pattern) in enumerate(cases):
        with pytest.raises(detlogp.LogprobContractError, match=pattern):
            fn()


def test_opcheck_with_leading_dims():
    hidden, weight, view, ids, mask, temps = _inputs("causal shift", torch.float32, 7)
    args = (view(hidden).requires_grad_(), weight.requires_grad_(), ids, "", REAL, "", True,
            1.0, None, -100, True, None, "", None, 10.0, temps, mask, None, True)
    torch.library.opcheck(_ops.fused_linear_logprobs, args)


def test_compiled_equals_eager():
    """fullgraph, dynamic shapes (two sequence lengths), the causal-shift view: no graph
    break, eager's bits for logp, entropy and both gradients (aot_eager: the loss is eager's)."""
    def loss_fn(hidden, weight, ids, mask):
        logp, ent = dt.fused_vocab_parallel_logprobs(hidden[:, :-1], weight, ids[:, 1:],
                                                     real_vocab=REAL, loss_mask=mask,
                                                     entropy=True)
        return (logp * mask).sum() / mask.sum() + 0.1 * ent.mean(), logp, ent

    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, fullgraph=True, dynamic=True, backend="aot_eager")
    g = torch.Generator().manual_seed(8)
    weight = (torch.randn(V, H, generator=g) * 0.4).bfloat16()
    for i, s in enumerate((5, 9)):
        hidden = torch.randn(B, s, H, generator=g).bfloat16()
        ids = torch.randint(0, REAL, (B, s), generator=g)
        mask = (torch.rand(B, s - 1, generator=g) > 0.3).float()
        runs = []
        for fn in (loss_fn, compiled):
            h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
            with torch._dynamo.config.patch(error_on_recompile=fn is compiled and i > 0):
                out = fn(h, w, ids, mask)
            out[0].backward()
            runs.append([o.detach() for o in out] + [h.grad, w.grad])
        for name, a, b in zip(("loss", "logp", "entropy", "grad_hidden", "grad_weight"),
                              *runs):
            assert_bitwise(a, b, f"seq {s}: {name}")
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def tp_ranks(tmp_path_factory):
    return {world: run_workers(fw.main, tmp_path_factory.mktemp(f"dropin{world}"), world,
                               TIMEOUT_S)[0] for world in (2, 4)}


def test_tp_degrees_give_the_same_bits(tp_ranks):
    hidden, weight, _, _, _ = fw.problem()
    ref = fw.run(hidden, weight, None)
    for world, ranks in tp_ranks.items():
        local = fw.V // world
        for rank, res in enumerate(ranks):
            bounds = {"even": (rank * local, (rank + 1) * local),
                      "table": [(0, 384), (384, fw.V)][rank] if world == 2 else None,
                      "dtensor": (rank * local, (rank + 1) * local),
                      "dtensor hidden": (rank * local, (rank + 1) * local)}
            for case, got in res.items():
                what = f"TP={world} rank {rank} {case}"
                for name in ("logp", "entropy", "grad_hidden"):
                    assert_bitwise(got[name], ref[name], f"{what}: {name}")
                s, e = bounds[case]
                assert_bitwise(got["grad_weight"], ref["grad_weight"][s:e],
                               f"{what}: grad_weight")
    assert set(tp_ranks[2][0]) == {"even", "table", "dtensor", "dtensor hidden"}
