"""Contract builders and bit-level comparisons for the detlogp Python tests."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import torch

import detlogp


def contract(n, real, padded, bounds=None, rank=0, dtype="fp32", mask=None, tile_width=64,
             temperature=1.0, scope="cross_tp_bitwise", ignore_index=-100, **kw):
    bounds = bounds if bounds is not None else [(0, padded)]
    mask = mask if mask is not None else [True] * n
    return detlogp.LogprobContract(
        role="train", dtype=dtype,
        mask=detlogp.MaskSpec(num_tokens=n, active_mask=mask, ignore_index=ignore_index),
        sharding=detlogp.ShardingSpec(tp_rank=rank, tp_world_size=len(bounds),
                                      vocab_shard_bounds=bounds, real_vocab_size=real,
                                      padded_vocab_size=padded),
        reduction=detlogp.ReductionSpec(determinism_scope=scope),
        tile_width=tile_width, temperature=temperature, **kw)


TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def problem(n=23, real=1000, padded=1024, stream=0, scale=3.0, inactive=(1, 7, 8)):
    """fp32 logits [n, padded] (padding columns hold junk, never read as targets), targets with
    ignore_index on inactive rows, and the mask."""
    g = torch.Generator().manual_seed(stream)
    x = torch.randn(n, padded, generator=g) * scale
    x[:, real:] = 1e4  # padding columns: junk that must never contribute
    t = torch.randint(0, real, (n,), generator=g)
    mask = [i not in inactive for i in range(n)]
    t[[i for i in inactive if i < n]] = -100
    return x, t, mask


def bits(a):
    """The raw bits of a float array/tensor, for bitwise comparisons (-0.0 != +0.0, NaN ok)."""
    if isinstance(a, torch.Tensor):
        a = a.detach()
        view = {torch.float32: torch.int32, torch.bfloat16: torch.int16,
                torch.float16: torch.int16}[a.dtype]
        return a.contiguous().view(view).numpy().copy()
    a = np.ascontiguousarray(a)
    return a.view({4: np.uint32, 2: np.uint16}[a.itemsize]).copy()


def assert_bitwise(a, b, what=""):
    ba, bb = bits(a), bits(b)
    assert ba.shape == bb.shape, (what, ba.shape, bb.shape)
    if not np.array_equal(ba, bb):
        idx = np.argwhere(ba != bb)[:5]
        raise AssertionError(f"{what}: not bitwise equal at {idx.tolist()}")


def run_child_script(script, timeout=120):
    """Runs ``script`` in a fresh interpreter that imports what this one does (this folder and
    this sys.path), so that a crash or a deadlock fails one test instead of the test run.
    Returns the CompletedProcess (text stdout and stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(pathlib.Path(__file__).parent)] + [p for p in sys.path if p]))
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=timeout)
