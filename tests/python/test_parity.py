"""The Python wrapper behaves like the C++ operator: the order of its checks, replace() on every
contract field, the entropy without its gradient, and drift() equal to `detlogp drift`."""

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest
import torch

import detlogp
from detlogp import LogprobContractError, ReductionSpec
from helpers import assert_bitwise, contract, problem

REAL, PADDED, W = 1000, 1024, 64


def op_for(c):
    return detlogp.get_logprob_op(c).op


# --- error order -------------------------------------------------------------------------------


def test_contract_and_shape_checks_come_before_the_missing_group():
    x, t, _ = problem(n=6, inactive=())
    tp2 = contract(6, REAL, PADDED, bounds=[(0, 512), (512, 1024)], tile_width=W)
    op = op_for(tp2)
    # Everything right but the group: the transport error.
    with pytest.raises(LogprobContractError, match="requires an initialized process group"):
        op(x[:, :512], t, contract=tp2)
    # Shape, row count, dtype and tile problems first, with the C++ operator's messages.
    with pytest.raises(LogprobContractError, match="has 500 vocab columns"):
        op(x[:, :500], t, contract=tp2)
    with pytest.raises(LogprobContractError, match="MaskSpec declares num_tokens=6"):
        op(x[:5, :512], t[:5], contract=tp2)
    with pytest.raises(LogprobContractError, match="does not match the contract dtype"):
        op(x[:, :512].bfloat16(), t, contract=tp2)
    with pytest.raises(LogprobContractError, match="one entry per token"):
        op(x[:, :512], t[:4], contract=tp2)
    # Unaligned shard bounds are fine: a 500-column shard reaches the group check.
    misaligned = contract(6, REAL, PADDED, bounds=[(0, 500), (500, 1024)], tile_width=W)
    with pytest.raises(LogprobContractError, match="requires an initialized process group"):
        op(x[:, :500], t, contract=misaligned)
    with pytest.raises(LogprobContractError, match="cross_tp_bitwise"):
        op(x[:, :512], t, contract=tp2, deterministic=False)
    # The same order as a C++ forward on a one-rank communicator reports (it reaches the
    # transport check last), shown on the unaligned contract with a wrong shape.
    with pytest.raises(LogprobContractError, match="has 400 vocab columns") as py_err:
        op(x[:, :400], t, contract=misaligned)
    with pytest.raises(LogprobContractError, match="has 400 vocab columns") as cpp_err:
        op(x[:, :400], t, contract=misaligned, group=detlogp.SelfComm())
    assert str(py_err.value) == str(cpp_err.value)


# --- replace -----------------------------------------------------------------------------------


def test_replace_every_contract_field_none_included():
    c = contract(6, REAL, PADDED, tile_width=None)
    assert c.num_vocab_tiles is None and c.tile_width == 128
    c8 = c.replace(num_vocab_tiles=8)
    assert c8.num_vocab_tiles == 8 and c8.tile_width == PADDED // 8
    # Changing one tile spec drops the other; None goes back to the default.
    assert c8.replace(tile_width=256).tile_width == 256
    assert c8.replace(tile_width=256).num_vocab_tiles is None
    assert c8.replace(num_vocab_tiles=None).tile_width == 128
    assert c.replace(tile_width=64).replace(tile_width=None).tile_width == 128
    assert c.replace(reduction=None) == c and c.replace(output=None) == c
    assert c.replace(role="infer").role == detlogp.Role.infer
    assert c.replace(dtype="bf16").dtype == detlogp.DType.bf16
    assert c.replace(temperature=0.5).temperature == 0.5
    assert c.replace(export_lse=True) == c
    mask = detlogp.MaskSpec(6, [True, False] * 3)
    assert c.replace(mask=mask).mask == mask
    sh = c.sharding.replace(cp_world_size=2)
    assert c.replace(sharding=sh).sharding.cp_world_size == 2
    red = ReductionSpec(determinism_scope="fixed_topology")
    assert c.replace(reduction=red).reduction == red
    # Each field as is rebuilds an equal contract.
    fields = ["role", "dtype", "mask", "sharding", "reduction", "output", "export_lse",
              "tile_width", "num_vocab_tiles", "temperature"]
    for f in fields:
        assert c8.replace(**{f: getattr(c8, f)}).to_json() == c8.to_json(), f
    # None where the constructor refuses it: its own error, not a TypeError.
    with pytest.raises(LogprobContractError, match="mask must be a MaskSpec"):
        c.replace(mask=None)
    with pytest.raises(LogprobContractError, match="sharding must be a ShardingSpec"):
        c.replace(sharding=None)
    with pytest.raises(TypeError, match="no field"):
        c.replace(vocab=3)


def test_replace_every_field_of_the_other_types():
    c = contract(6, REAL, PADDED)
    values = {
        c.sharding: dict(tp_rank=0, tp_world_size=1, vocab_shard_bounds=[(0, 1024)],
                         real_vocab_size=999, padded_vocab_size=1024, cp_rank=1,
                         cp_world_size=2),
        c.mask: dict(num_tokens=2, active_mask=[True, False], ignore_index=-1),
        c.reduction: dict(merge="max_sumexp", merge_axis="tp_vocab", acc_dtype="fp32",
                          order="global_vocab_shard_index", transport="all_gather",
                          downcast_at="final_write", engine="in_op_reference",
                          determinism_scope="fixed_topology"),
        c.output: dict(selected_logp_dtype="fp32", lse_dtype="fp32", tp_placement="replicated"),
    }
    for obj, changes in values.items():
        new = obj.replace(**changes)  # every field at once (some are only valid together)
        for field, value in changes.items():
            got = getattr(new, field)
            got = got.value if hasattr(got, "value") else got
            want = tuple(map(tuple, value)) if field == "vocab_shard_bounds" else value
            want = tuple(value) if field == "active_mask" else want
            assert got == want, (type(obj).__name__, field)
    cap = detlogp.get_logprob_op(c).capability
    assert cap.replace(tp_world_sizes=None).tp_world_sizes is None
    assert cap.replace(tile_widths=(64,)).tile_widths == (64,)
    assert cap.replace(cp_world_sizes=(1, 2)).cp_world_sizes == (1, 2)


# --- entropy without its gradient --------------------------------------------------------------


def test_entropy_without_gradient_same_bits_no_grad_and_rejected_grad():
    x, t, mask = problem(n=9, inactive=(2,))
    c = contract(9, REAL, PADDED, mask=mask, tile_width=W)
    op = op_for(c)
    xa = x.clone().requires_grad_(True)
    logp_a, lse_a, ent_a = op(xa, t, contract=c, entropy=True)
    xb = x.clone().requires_grad_(True)
    logp_b, lse_b, ent_b = op(xb, t, contract=c, entropy=True, entropy_grad=False)
    assert ent_a.requires_grad and not ent_b.requires_grad
    assert_bitwise(ent_a, ent_b, "entropy")
    assert_bitwise(logp_a, logp_b, "logp")
    assert_bitwise(lse_a, lse_b, "lse")
    # Using the entropy in the loss contributes nothing to the gradient (it is a constant).
    (logp_a.sum() + 0.5 * lse_a.sum()).backward()
    (logp_b.sum() + 0.5 * lse_b.sum() + ent_b.sum()).backward()
    assert_bitwise(xa.grad, xb.grad, "grad")
    # The apply_with_entropy spelling.
    xc = x.clone().requires_grad_(True)
    *_, ent_c = op.apply_with_entropy(xc, t, contract=c, with_entropy_grad=False)
    assert not ent_c.requires_grad
    # The explicit backward refuses a gradient for the constant entropy.
    fwd = op.forward(x, t, contract=c, entropy=True, entropy_grad=False)
    with pytest.raises(LogprobContractError, match="entropy_grad=false"):
        fwd.backward(grad_entropy=torch.ones(9))
    fwd.backward(grad_logp=torch.ones(9))
    with pytest.raises(LogprobContractError, match="entropy_grad must be a bool"):
        op(x, t, contract=c, entropy=True, entropy_grad=0)


# --- drift -------------------------------------------------------------------------------------


def cli_bin():
    build = os.environ.get("DETLOGP_BUILD_DIR")
    root = pathlib.Path(build) if build else pathlib.Path(__file__).parents[2] / "build"
    path = root / "bin" / "detlogp"
    if not path.exists():
        pytest.skip(f"the detlogp CLI is not built ({path})")
    return path


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_drift_equals_the_cli_on_the_same_values(tmp_path, dtype):
    rng = np.random.default_rng(11)
    ref = rng.uniform(-12, 0, 300).astype(np.float32)
    cand = (ref + rng.normal(0, 3e-3, 300)).astype(np.float32)
    ref[5] = 0.0  # a zero reference: max_rel stays finite
    mask = rng.uniform(size=300) < 0.8
    np.save(tmp_path / "c.npy", cand)
    np.save(tmp_path / "r.npy", ref)
    np.save(tmp_path / "m.npy", mask)
    proc = subprocess.run([str(cli_bin()), "drift", "--candidate", "c.npy", "--reference", "r.npy",
                           "--mask", "m.npy", "--dtype", dtype, "--json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    cli = json.loads(proc.stdout)
    py = detlogp.drift(torch.from_numpy(cand), torch.from_numpy(ref),
                       mask=torch.from_numpy(mask), dtype=dtype)
    for key in ("command", "candidate", "reference", "mask"):
        cli.pop(key)
    assert py == cli  # every statistic, the thresholds, the failures and the verdict
    assert proc.returncode == (0 if py["passed"] else 1)


def test_drift_statistics_on_tensors():
    cand = torch.tensor([100.0, 1.0, 3.0])
    ref = torch.tensor([0.0, 2.0, 1.0])
    d = detlogp.drift(cand, ref, mask=torch.tensor([False, True, True]), dtype="fp32")
    assert (d["count"], d["max_abs"], d["mean_abs"]) == (2, 2.0, 1.5)
    assert d["worst"]["index"] == 2 and d["passed"] is False
    assert detlogp.drift([1.0], [0.0])["max_rel"] == pytest.approx(1e12)
    same = detlogp.drift(np.array([-1.0, -2.0]), np.array([-1.0, -2.0]), dtype=torch.bfloat16)
    assert same["passed"] and same["dtype"] == "bf16" and same["max_abs"] == 0.0
    nan = detlogp.drift([float("nan"), -1.0], [-1.0, -1.0])
    assert nan["non_finite"] == 1 and not nan["passed"]
    assert detlogp.drift_thresholds("bf16")["max_abs"] == 6e-2
    with pytest.raises(LogprobContractError, match="shape"):
        detlogp.drift([1.0, 2.0], [1.0])
    with pytest.raises(LogprobContractError, match="one entry per token"):
        detlogp.drift([1.0, 2.0], [1.0, 2.0], mask=[True])
    with pytest.raises(LogprobContractError, match="dtype must be one of"):
        detlogp.drift([1.0], [1.0], dtype="fp8")
