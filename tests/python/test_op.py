"""The op on NumPy arrays and torch tensors: accuracy against float64 torch (fp32 logprob
within 1e-5), bitwise agreement with the C++ library (reference kernels, the C++ in-process TP
group, NumPy vs torch input, strided views), dispatch and provenance, input checks."""

import json

import numpy as np
import pytest
import torch

import detlogp
from detlogp import LogprobContractError, _detlogp
from helpers import TORCH_DTYPES, assert_bitwise, contract, problem

REAL, PADDED, W = 1000, 1024, 64
ATOL = 1e-5  # the fp32 logprob tolerance (docs/cli.md, drift tolerances)


def expected(x, t, mask, temperature=1.0):
    """float64 torch: logp (0 on inactive rows), lse and entropy over the real vocabulary."""
    z = x[:, :REAL].double() / temperature
    logsm = torch.log_softmax(z, -1)
    safe = torch.where(torch.tensor(mask), t, torch.zeros_like(t))
    logp = logsm.gather(1, safe[:, None])[:, 0] * torch.tensor(mask, dtype=torch.float64)
    lse = torch.logsumexp(z, -1)
    ent = -(logsm.exp() * logsm).sum(-1)
    return logp, lse, ent


def op_for(c, backend="auto"):
    return detlogp.get_logprob_op(c, requested_backend=backend).op


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_agrees_with_float64_log_softmax(dtype, temperature):
    x, t, mask = problem()
    xd = x.to(TORCH_DTYPES[dtype])
    c = contract(len(t), REAL, PADDED, mask=mask, dtype=dtype, tile_width=W,
                 temperature=temperature)
    logp, lse, ent = op_for(c)(xd, t, contract=c, entropy=True)
    assert logp.dtype == lse.dtype == ent.dtype == torch.float32
    # The reference sees the same (rounded) logits and the same float32 temperature.
    e_logp, e_lse, e_ent = expected(xd.float(), t, mask, c.temperature)
    assert (logp.double() - e_logp).abs().max() <= ATOL
    assert (lse.double() - e_lse).abs().max() <= ATOL
    assert (ent.double() - e_ent).abs().max() <= ATOL
    inactive = ~torch.tensor(mask)
    assert_bitwise(logp[inactive], torch.zeros(int(inactive.sum())), "inactive logp is +0.0")


def test_production_and_reference_backends_are_bitwise_equal():
    x, t, mask = problem(n=31, stream=3)
    xb = x.bfloat16()
    c = contract(31, REAL, PADDED, mask=mask, dtype="bf16", tile_width=W)
    prod = detlogp.get_logprob_op(c, "production")
    ref = detlogp.get_logprob_op(c, "reference")
    assert prod.actual_backend == detlogp.CPU_CANONICAL_BACKEND_ID
    assert ref.actual_backend == detlogp.CPU_REFERENCE_BACKEND_ID
    assert ref.op.kernel_name == "scalar-reference"
    w = torch.randn(3, 31)
    outs, grads = [], []
    for op in (prod.op, ref.op):
        xg = xb.clone().requires_grad_()
        o = op(xg, t, contract=c, entropy=True)
        sum(wi * oi for wi, oi in zip(w, o)).sum().backward()
        outs.append(o)
        grads.append(xg.grad)
    for a, b, name in zip(outs[0], outs[1], ("logp", "lse", "entropy")):
        assert_bitwise(a, b, name)
    assert grads[0].dtype == torch.bfloat16
    assert_bitwise(grads[0], grads[1], "grad")


@pytest.mark.parametrize("tp,bounds", [(2, [(0, 512), (512, 1024)]),
                                       (4, [(0, 192), (192, 512), (512, 896), (896, 1024)])])
def test_python_tp1_equals_cpp_in_process_tp(tp, bounds):
    """The C++ library alone (ranks as threads of an InProcessGroup, no Python in the loop) on
    the same inputs gives the same bits as the Python op at TP=1."""
    x, t, mask = problem(stream=5)
    c1 = contract(len(t), REAL, PADDED, mask=mask, tile_width=W)
    op = op_for(c1)
    logp, lse, ent = op(x, t, contract=c1, entropy=True)
    shards = [x[:, s:e] for s, e in bounds]  # strided views, no copy
    contracts = [contract(len(t), REAL, PADDED, bounds=bounds, rank=r, mask=mask, tile_width=W)
                 for r in range(tp)]
    per_rank = _detlogp.in_process_forward(
        op=op._cpp, dtype="fp32",
        shards=[(s.data_ptr(), s.shape[0], s.shape[1], s.stride(0)) for s in shards],
        contracts=[k._cpp for k in contracts], targets=t.numpy(), deterministic=True,
        entropy=True)
    assert len(per_rank) == tp
    for r, (lp, ls, en) in enumerate(per_rank):
        assert_bitwise(lp, logp.numpy(), f"rank {r} logp")
        assert_bitwise(ls, lse.numpy(), f"rank {r} lse")
        assert_bitwise(en, ent.numpy(), f"rank {r} entropy")


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_numpy_and_torch_inputs_give_the_same_bits(dtype):
    x, t, mask = problem(stream=7)
    xt = x.to(TORCH_DTYPES[dtype])
    xn = xt.numpy()
    c = contract(len(t), REAL, PADDED, mask=mask, dtype=dtype, tile_width=W)
    op = op_for(c)
    a = op(xt, t, contract=c, entropy=True)
    b = op(xn, t.numpy(), contract=c, entropy=True)
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in b)
    for u, v in zip(a, b):
        assert_bitwise(u.numpy(), v)
    # explicit forward/backward on NumPy: gradient in the logits dtype, same bits as torch
    f = op.forward(xn, t.numpy(), contract=c, entropy=True)
    gl = np.linspace(-1, 1, len(t), dtype=np.float32)
    g = f.backward(grad_logp=gl, grad_lse=gl[::-1].copy(), grad_entropy=None)
    assert g.dtype == xn.dtype and g.shape == xn.shape
    xg = xt.clone().requires_grad_()
    lp, ls, en = op(xg, t, contract=c, entropy=True)
    (torch.from_numpy(gl) * lp + torch.from_numpy(gl[::-1].copy()) * ls).sum().backward()
    assert_bitwise(xg.grad.numpy(), g, "numpy vs torch grad")


def test_strided_views_are_read_in_place_and_match_contiguous_copies():
    x, t, mask = problem(stream=9)
    big = torch.randn(len(t), 3 * PADDED)
    big[:, PADDED:2 * PADDED] = x
    view = big[:, PADDED:2 * PADDED]  # row stride 3 * PADDED
    assert not view.is_contiguous()
    c = contract(len(t), REAL, PADDED, mask=mask, tile_width=W)
    op = op_for(c)
    f = op.forward(view, t, contract=c)
    assert f.saved_logits_data_ptr == view.data_ptr()
    assert f._handle.saved_logits_row_stride == 3 * PADDED
    g = op.forward(x.contiguous(), t, contract=c)
    assert_bitwise(f.logp, g.logp)
    assert_bitwise(f.lse, g.lse)
    # a transposed (column-strided) input is refused rather than silently copied
    with pytest.raises(LogprobContractError, match="contiguous in its last dimension"):
        op(x.t().contiguous().t(), t, contract=c)
    # NumPy slices too
    bn = big.numpy()[:, PADDED:2 * PADDED]
    h = op.forward(bn, t.numpy(), contract=c)
    assert h.saved_logits_data_ptr == bn.__array_interface__["data"][0]
    assert_bitwise(h.logp, g.logp.numpy())


def test_batch_invariance_and_thread_count_invariance():
    x, t, mask = problem(n=17, stream=11, inactive=())
    c = contract(17, REAL, PADDED, tile_width=W)
    op = op_for(c)
    full = op.forward(x, t, contract=c, threads=0)
    one_thread = op.forward(x, t, contract=c, threads=1)
    assert_bitwise(full.lse, one_thread.lse)
    c1 = contract(1, REAL, PADDED, tile_width=W)
    for i in (0, 5, 16):
        row = op.forward(x[i:i + 1], t[i:i + 1], contract=c1)
        assert_bitwise(row.lse, full.lse[i:i + 1], f"row {i} alone vs in batch")
        assert_bitwise(row.logp, full.logp[i:i + 1], f"row {i} alone vs in batch")


def test_dispatch_and_provenance():
    c = contract(4, REAL, PADDED, tile_width=W)
    result = detlogp.get_logprob_op(c)
    op, prov = result  # unpacks as (op, provenance)
    assert op is result.op and prov is result.provenance and result[1] is prov
    assert json.loads(json.dumps(prov)) == prov
    assert prov["requested_backend"] == "auto"
    assert prov["actual_backend"] == op.backend_id == result.actual_backend
    assert prov["fallback"] is False and result.fallback is False
    assert prov["contract"] == c.to_dict()
    assert prov["capability"] == result.capability.to_dict()
    assert result.capability.supports(c)
    ref = detlogp.get_logprob_op(c, requested_backend="  REFERENCE ")
    assert ref.provenance["requested_backend"] == "REFERENCE"
    assert ref.actual_backend == detlogp.CPU_REFERENCE_BACKEND_ID
    exact = detlogp.get_logprob_op(c, detlogp.CPU_REFERENCE_BACKEND_ID)
    assert exact.actual_backend == detlogp.CPU_REFERENCE_BACKEND_ID
    with pytest.raises(LogprobContractError, match="determinism_scope"):
        detlogp.get_logprob_op(c, "deterministic")
    with pytest.raises(LogprobContractError, match="requested_backend must be a non-empty"):
        detlogp.get_logprob_op(c, 3)
    with pytest.raises(LogprobContractError, match="contract must be a LogprobContract"):
        detlogp.get_logprob_op(c.to_dict())
    with pytest.raises(RuntimeError, match="No logprob backend supports"):
        detlogp.get_logprob_op(c, "no-such-backend")


def test_invocation_checks():
    x, t, mask = problem(n=6, inactive=())
    c = contract(6, REAL, PADDED, tile_width=W)
    op = op_for(c)
    with pytest.raises(LogprobContractError, match="does not match the contract dtype"):
        op(x.bfloat16(), t, contract=c)
    with pytest.raises(LogprobContractError, match="has 1000 vocab columns"):
        op(x[:, :1000], t, contract=c)
    with pytest.raises(LogprobContractError, match="MaskSpec declares num_tokens=6"):
        op(x[:5], t[:5], contract=c)
    with pytest.raises(LogprobContractError, match="must be 2-D"):
        op(x[0], t, contract=c)
    with pytest.raises(LogprobContractError, match="1-D with one entry per token"):
        op(x, t[:, None], contract=c)
    with pytest.raises(LogprobContractError, match="must hold integers"):
        op(x, t.float(), contract=c)
    with pytest.raises(LogprobContractError, match="torch.float64 is not supported"):
        op(x.double(), t, contract=c)
    with pytest.raises(LogprobContractError, match="active target_ids must lie in the real "
                                                   r"vocabulary \[0, 1000\)"):
        op(x, torch.tensor([0, 1, 2, 3, 4, 1000]), contract=c)
    with pytest.raises(LogprobContractError, match="non-finite logsumexp on an active row"):
        y = x.clone()
        y[2, 3] = float("inf")
        op(y, t, contract=c)
    aligned = contract(6, REAL, PADDED, bounds=[(0, 512), (512, 1024)], tile_width=W)
    with pytest.raises(LogprobContractError, match="requires an initialized process group"):
        op(x[:, :512], t, contract=aligned)
    # Contract and shape problems come before the missing group, as in the C++ operator.
    # Unaligned shard bounds are no contract problem: the missing group is reported.
    bad = contract(6, REAL, PADDED, bounds=[(0, 500), (500, 1024)], tile_width=W)
    with pytest.raises(LogprobContractError, match="requires an initialized process group"):
        op(x[:, :500], t, contract=bad)
    with pytest.raises(LogprobContractError, match="the communicator has 1 ranks"):
        c2 = contract(6, REAL, PADDED, bounds=[(0, 500), (500, 1024)], tile_width=W)
        op(x[:, :500], t, contract=c2, group=detlogp.SelfComm())
    with pytest.raises(LogprobContractError, match="cross_tp_bitwise"):
        op(x, t, contract=c, deterministic=False)
    with pytest.raises(LogprobContractError, match="threads must be 0"):
        op.forward(x, t, contract=c, threads=-1)
    with pytest.raises(LogprobContractError, match="threads must be 0"):
        op.forward(x, t, contract=c, threads=2**40)
    with pytest.raises(LogprobContractError, match="must fit in int64"):
        op(x.numpy(), np.array([0, 1, 2, 3, 4, 2**63], dtype=np.uint64), contract=c)
    # deterministic=False with fixed_topology: fine, and within tolerance of the canon
    cf = contract(6, REAL, PADDED, tile_width=W, scope="fixed_topology")
    a = op(x, t, contract=cf, deterministic=False)
    b = op(x, t, contract=cf)
    assert (a[0] - b[0]).abs().max() <= ATOL
