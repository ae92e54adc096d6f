"""detlogp's torch.library custom ops (detlogp/_ops.py): torch.library.opcheck passes for each
(schema, autograd registration, fake tensor, AOT dispatch with dynamic shapes), the public API
runs through them, and the state backward needs lives exactly as long as autograd keeps it."""

import gc

import pytest

torch = pytest.importorskip("torch")

import detlogp  # noqa: E402
import detlogp.torch as dt  # noqa: E402
from detlogp import _ops  # noqa: E402
from helpers import assert_bitwise  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

REAL, V = 200, 256


def _logits(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, V, generator=g) * 2).to(dtype)


def _targets(shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, REAL, shape, generator=g)
    t.view(-1)[1] = -100
    return t


def _logprobs_args(logits, targets, *, mask=None, entropy=False, entropy_grad=True,
                   temperature=1.0, real_vocab=REAL, softcap=None):
    """The op's arguments, as ``detlogp.torch.vocab_parallel_logprobs`` passes them (a tensor
    temperature, one per token, as the last argument with the scalar 1)."""
    rows = temperature if isinstance(temperature, torch.Tensor) else None
    return (logits, targets, mask, "", real_vocab, -100, 1.0 if rows is not None else temperature,
            entropy, True, None, None, None, None, entropy_grad, "", softcap, rows)


CASES = {
    "fp32": dict(shape=(9,), dtype=torch.float32),
    "bf16, entropy, mask": dict(shape=(2, 6), dtype=torch.bfloat16, entropy=True, mask=True),
    "fp32, entropy without grad, temperature": dict(shape=(3, 4), dtype=torch.float32,
                                                    entropy=True, entropy_grad=False,
                                                    temperature=0.7),
    "bf16, entropy, softcap": dict(shape=(2, 5), dtype=torch.bfloat16, entropy=True,
                                   softcap=3.0),
    "fp32, entropy, softcap, per-token temperature": dict(
        shape=(2, 5), dtype=torch.float32, entropy=True, softcap=3.0,
        temperature=0.5 + torch.arange(10, dtype=torch.float32).view(2, 5) / 8),
}


@pytest.mark.parametrize("case", list(CASES))
def test_opcheck_vocab_parallel_logprobs(case):
    c = dict(CASES[case])
    shape, dtype = c.pop("shape"), c.pop("dtype")
    logits = _logits(shape, dtype).requires_grad_()
    if c.pop("mask", False):
        c["mask"] = (torch.arange(torch.Size(shape).numel()) % 3 != 0).view(shape)
    torch.library.opcheck(_ops.vocab_parallel_logprobs,
                          _logprobs_args(logits, _targets(shape), **c))


def test_opcheck_vocab_parallel_logprobs_on_the_causal_shift():
    """A view of [B, S, V] logits whose rows are not the tokens in order."""
    full = _logits((2, 7), torch.float32).requires_grad_()
    torch.library.opcheck(_ops.vocab_parallel_logprobs,
                          _logprobs_args(full[:, :-1], _targets((2, 6)), entropy=True))


def _metadata(t):
    return tuple(t.shape), t.stride(), t.dtype, t.device


@pytest.mark.parametrize("view", ["contiguous", "causal shift", "column slice", "transpose",
                                  "seq-major", "no tokens"])
def test_the_backward_ops_fake_gradient_is_the_real_one(view):
    """The backward op's fake output has the real gradient's shape, strides and dtype (the
    compiler lays out the graph by it); its saved-state input cannot be deep-copied, so
    opcheck exercises it through the forward op's autograd, and this checks it directly."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    full = _logits((3, 9), torch.bfloat16)
    logits = {"contiguous": full, "causal shift": full[:, :-1], "column slice": full[..., :128],
              "transpose": full.transpose(0, 1), "seq-major": full.transpose(0, 1)[:-1],
              "no tokens": full[:0]}[view]
    targets = _targets(tuple(logits.shape[:-1])) if logits.numel() else \
        torch.zeros(logits.shape[:-1], dtype=torch.int64)
    targets = targets.clamp(max=logits.shape[-1] - 1)
    logp, ent, saved = _ops.vocab_parallel_logprobs(
        *_logprobs_args(logits, targets, entropy=True, real_vocab=None))
    real = _ops.vocab_parallel_logprobs_backward(logits, saved, torch.ones_like(logp), None)
    with FakeTensorMode() as mode:
        fake = _ops.vocab_parallel_logprobs_backward(
            mode.from_tensor(logits), mode.from_tensor(saved), mode.from_tensor(logp), None)
    assert _metadata(fake) == _metadata(real)


@pytest.mark.parametrize("dtype,entropy,softcap,rows", [(torch.float32, False, None, False),
                                                        (torch.bfloat16, True, 2.5, False),
                                                        (torch.float32, True, None, True)])
def test_opcheck_fused_linear_logprobs(dtype, entropy, softcap, rows):
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(7, 24, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(V, 24, generator=g) * 0.3).to(dtype).requires_grad_()
    targets = _targets((7,))
    row_temperature = 0.5 + torch.arange(7, dtype=torch.float32) / 4 if rows else None
    args = (hidden, weight, targets, "", REAL, "", entropy, 1.0, 64, -100, True, None, "",
            None, softcap, row_temperature)
    torch.library.opcheck(_ops.fused_linear_logprobs, args)


class _OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_public_api_runs_through_the_ops():
    logits = _logits((2, 5), torch.float32).requires_grad_()
    targets = _targets((2, 5))
    calls = {
        "detlogp.vocab_parallel_logprobs.default": [
            lambda: dt.vocab_parallel_logprobs(logits, targets, real_vocab=REAL),
            lambda: dt.vocab_parallel_cross_entropy(logits, targets),
            lambda: dt.vocab_parallel_log_probs_from_logits(logits, targets),
            lambda: dt.logprobs_from_logits(logits, targets)],
        "detlogp.fused_linear_logprobs.default": [
            lambda: detlogp.fused_linear_logprobs(torch.randn(3, 8), torch.randn(V, 8),
                                                  torch.tensor([1, 2, 3]))],
    }
    for op, fns in calls.items():
        for fn in fns:
            with _OpNames() as mode:
                fn()
            assert op in mode.names, (op, mode.names)


def test_backward_state_lives_as_long_as_autograd_keeps_it():
    gc.collect()
    before = len(_ops._SAVED)
    logits = _logits((4,), torch.float32).requires_grad_()
    logp, ent = dt.vocab_parallel_logprobs(logits, _targets((4,)), real_vocab=REAL,
                                           entropy=True)
    assert len(_ops._SAVED) == before + 1  # kept by the graph for backward
    (logp.sum() + ent.sum()).backward()
    gc.collect()
    assert len(_ops._SAVED) == before  # freed with the saved tensors after backward
    logp = dt.vocab_parallel_logprobs(logits, _targets((4,)), real_vocab=REAL)
    assert len(_ops._SAVED) == before + 1
    del logp  # no backward: freed with the graph
    gc.collect()
    assert len(_ops._SAVED) == before
    with torch.no_grad():
        dt.vocab_parallel_logprobs(logits, _targets((4,)), real_vocab=REAL)
    gc.collect()
    assert len(_ops._SAVED) == before  # nothing kept without autograd


def test_a_kept_gradient_is_never_handed_out_again():
    """The pool of gradient buffers reuses one only when no tensor refers to it: an op's
    output that autograd (here: .grad) still holds keeps its memory."""
    cache = dt.CallCache(min_pooled_bytes=0)
    targets = _targets((64,))
    grads = []
    for seed in range(3):
        leaf = _logits((64,), torch.float32, seed).requires_grad_()
        dt.vocab_parallel_logprobs(leaf, targets, real_vocab=REAL, cache=cache).sum().backward()
        grads.append((leaf.grad, leaf.grad.clone()))
    ptrs = [g.data_ptr() for g, _ in grads]
    assert len(set(ptrs)) == 3  # every gradient still held: three buffers
    for g, copy in grads:
        assert_bitwise(g, copy, "a held gradient was overwritten")
    del grads, leaf
    gc.collect()
    leaf = _logits((64,), torch.float32, 9).requires_grad_()
    dt.vocab_parallel_logprobs(leaf, targets, real_vocab=REAL, cache=cache).sum().backward()
    assert cache.stats["grad_reuses"] >= 1  # released ones come back

