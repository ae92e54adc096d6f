"""What the contract cache keeps: a digest of each mask as the key, and each kept contract holds
its mask once (one bit per token); the masks kept stay under ``contract_bytes``. Memory is
counted in bytes the C allocator has handed out (glibc's mallinfo2: C++ and Python objects
alike), before and after the cache lets go of everything."""

import ctypes
import gc

import numpy as np
import pytest
import torch

import detlogp.torch as dt

TOKENS = 1 << 18
CALLS = 24


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _in_use_bytes():
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("glibc without mallinfo2")
    libc.mallinfo2.restype = _MallInfo2
    gc.collect()
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd  # in use: heap chunks + mmapped chunks


def _fill(cache, calls, seed=0):
    """``calls`` calls of TOKENS tokens, each with another mask."""
    logits = torch.zeros(TOKENS, 2)
    targets = torch.zeros(TOKENS, dtype=torch.long)
    rng = np.random.default_rng(seed)
    for _ in range(calls):
        mask = torch.from_numpy(rng.random(TOKENS) < 0.5)
        dt.vocab_parallel_logprobs(logits, targets, loss_mask=mask, cache=cache)


def _released_by_clear(cache):
    """Bytes the cache held: what its clear() gives back."""
    before = _in_use_bytes()
    cache.clear()
    return before - _in_use_bytes()


def test_kept_contracts_hold_one_bit_per_token():
    cache = dt.CallCache()
    _fill(cache, CALLS)
    assert cache.stats["contract_misses"] == CALLS
    held = _released_by_clear(cache)
    # One bit per token per contract, plus a little per contract (the C++ objects, the key).
    per_contract = TOKENS // 8
    assert held <= CALLS * (per_contract + 16 * 1024), (held, CALLS * per_contract)
    assert held >= CALLS * per_contract // 2, held  # the count sees the masks it keeps


def test_kept_masks_stay_under_contract_bytes():
    budget = 8 * (TOKENS // 8)  # room for 8 masks
    cache = dt.CallCache(contract_bytes=budget)
    logits = torch.zeros(TOKENS, 2)
    targets = torch.zeros(TOKENS, dtype=torch.long)
    rng = np.random.default_rng(1)
    masks = [torch.from_numpy(rng.random(TOKENS) < 0.5) for _ in range(CALLS)]
    for mask in masks:
        dt.vocab_parallel_logprobs(logits, targets, loss_mask=mask, cache=cache)
        assert cache.contract_mask_bytes() <= budget
    held = _released_by_clear(cache)
    assert held <= budget + 8 * 16 * 1024, held
    # The most recent masks are still hits; the oldest were dropped.
    dt.vocab_parallel_logprobs(logits, targets, loss_mask=masks[-1], cache=cache)
    assert cache.stats["contract_misses"] == 1  # cleared above: rebuilt once
    dt.vocab_parallel_logprobs(logits, targets, loss_mask=masks[-1], cache=cache)
    assert cache.stats["contract_hits"] == 1


def test_a_hit_needs_the_same_mask():
    cache = dt.CallCache()
    logits = torch.randn(64, 8)
    targets = torch.zeros(64, dtype=torch.long)
    mask = torch.ones(64, dtype=torch.bool)
    mask[3] = False
    a = dt.vocab_parallel_logprobs(logits, targets, loss_mask=mask, cache=cache,
                                   return_contract=True)[-1]
    b = dt.vocab_parallel_logprobs(logits, targets, loss_mask=mask.clone(), cache=cache,
                                   return_contract=True)[-1]
    other = mask.clone()
    other[3], other[4] = True, False  # same count, another token
    c = dt.vocab_parallel_logprobs(logits, targets, loss_mask=other, cache=cache,
                                   return_contract=True)[-1]
    assert a is b and c is not a
    assert c.mask.active_mask[4] is False and a.mask.active_mask[3] is False
    assert cache.stats["contract_hits"] == 1 and cache.stats["contract_misses"] == 2
