"""Which platform the op dispatches on (docs/python.md, "CUDA tensors"). CI has no GPU and a
CPU-only torch, so no CUDA tensor can exist here: these tests check the decision (logits' device
-> registry platform), the errors where CUDA cannot run, and that CPU tensors and NumPy arrays are
unchanged. The GPU results themselves are checked on a GPU machine (scripts/gpu-check.sh)."""

import numpy as np
import pytest
import torch

import detlogp
from detlogp import LogprobContractError, _buffers, _op
from helpers import contract, problem

BUILT, DEVICES, WHY = detlogp.cuda_status()
no_gpu = pytest.mark.skipif(DEVICES > 0, reason="a CUDA device exists here")


def test_cuda_status_is_truthful():
    assert isinstance(BUILT, bool) and isinstance(DEVICES, int) and isinstance(WHY, str)
    assert BUILT == detlogp.CUDA_BUILT
    if BUILT:
        assert detlogp.CUDA_CANONICAL_BACKEND_ID == "cuda-canonical-vocab-parallel-logp"
    else:
        assert detlogp.CUDA_CANONICAL_BACKEND_ID is None
        assert DEVICES == 0 and "without CUDA" in WHY
    if DEVICES == 0:
        assert WHY


def test_device_type_to_platform():
    assert _buffers.platform_for_device("cpu") == "cpu"
    assert _buffers.platform_for_device("cuda") == "cuda"
    for other in ("meta", "mps", "xpu"):
        with pytest.raises(LogprobContractError, match="CPU or CUDA tensor"):
            _buffers.platform_for_device(other)
    assert _buffers.platform_of(torch.zeros(2, 3)) == "cpu"
    assert _buffers.platform_of(np.zeros((2, 3), np.float32)) == "cpu"


def test_a_tensor_on_another_device_is_refused():
    c = contract(2, 128, 128, tile_width=64)
    op, _ = detlogp.get_logprob_op(c)
    x = torch.empty(2, 128, device="meta")
    with pytest.raises(LogprobContractError, match="CPU or CUDA tensor"):
        op(x, torch.tensor([0, 1]), contract=c)


@no_gpu
def test_cuda_platform_without_a_device_is_a_contract_error():
    c = contract(2, 128, 128, tile_width=64)
    expected = "no CUDA device" if BUILT else "built without CUDA"
    with pytest.raises(LogprobContractError, match=expected):
        detlogp.get_logprob_op(c, platform="cuda")
    # What a CUDA tensor given to a cpu op does: dispatch again on "cuda", which fails the same.
    op = detlogp.get_logprob_op(c).op
    with pytest.raises(LogprobContractError, match=expected):
        op._op_for("cuda", c)


def test_bad_platform():
    c = contract(2, 128, 128, tile_width=64)
    for bad in ("gpu", "CUDA", "", 0, None):
        with pytest.raises(LogprobContractError, match="platform must be"):
            detlogp.get_logprob_op(c, platform=bad)


def test_dispatch_decision_follows_the_logits(monkeypatch):
    """A cpu op keeps CPU logits on itself; logits on the other platform dispatch the same
    contract and request again on theirs (recorded here, nothing runs)."""
    c = contract(2, 128, 128, tile_width=64)
    d = detlogp.get_logprob_op(c, "production")
    assert d.platform == "cpu" and d.op.platform == "cpu"
    cpp, backend = d.op._op_for("cpu", c)
    assert cpp is d.op._cpp and backend == detlogp.CPU_CANONICAL_BACKEND_ID
    calls = []

    class Fake:
        op = "cuda-op"
        actual_backend = "cuda-canonical-vocab-parallel-logp"

    def fake_dispatch(contract_, requested, platform):
        calls.append((contract_, requested, platform))
        return Fake()

    monkeypatch.setattr(_op, "_dispatch", fake_dispatch)
    assert d.op._op_for("cuda", c) == ("cuda-op", "cuda-canonical-vocab-parallel-logp")
    assert calls == [(c, "production", "cuda")]


def test_cpu_tensors_and_numpy_are_unchanged():
    x, t, mask = problem(n=5, real=1000, padded=1024)
    c = contract(5, 1000, 1024, mask=mask, tile_width=64)
    op, _ = detlogp.get_logprob_op(c)
    fwd = op.forward(x, t, contract=c)
    assert fwd.platform == "cpu" and fwd.backend_id == detlogp.CPU_CANONICAL_BACKEND_ID
    assert fwd.logp.device.type == "cpu"
    g = fwd.backward(grad_logp=torch.ones(5))
    assert g.device.type == "cpu" and g.shape == x.shape
    fwd_np = op.forward(x.numpy(), t.numpy(), contract=c)
    assert fwd_np.platform == "cpu" and isinstance(fwd_np.logp, np.ndarray)
    with pytest.raises(LogprobContractError, match="CPU or CUDA tensor"):
        fwd.backward(grad_logp=torch.ones(5), out=torch.empty(5, 1024, device="meta"))
