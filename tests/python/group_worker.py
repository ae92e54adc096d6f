"""One rank of test_group_inference.py: torch.distributed (gloo) with two ranks, Megatron not
installed. Records what each entry point does without ``group=`` (and with a non-group) and
what a rank that passed its group sees when its peer forgot ``group=`` (Megatron's TP group
as the default: test_peers.py, with the real Megatron). Writes <out>/rank<r>.pt, then
leaves at once (a collective that its peer never joined stays pending)."""

import os
import sys
import time

S, B, H, REAL, V, TP = 4, 2, 16, 1000, 1024, 2
W = V // TP


def _attempt(fn):
    t0 = time.monotonic()
    try:
        value = fn()
    except Exception as e:  # noqa: BLE001 - recorded for the parent's assertion
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - t0}
    return {"value": value, "seconds": time.monotonic() - t0}


def _scenarios(rank, lonely):
    import torch
    import torch.distributed as dist

    import detlogp
    import detlogp.torch as dt

    out = {"megatron importable": _importable("megatron")}
    g = torch.Generator().manual_seed(0)
    full = torch.randn(S, B, V, generator=g) * 3
    ids = torch.randint(0, REAL, (S, B), generator=g)
    shard = full[..., rank * W:(rank + 1) * W]
    hidden = torch.randn(S * B, H, generator=g)
    full_weight = torch.randn(V, H, generator=g)
    weight = full_weight[rank * W:(rank + 1) * W]

    calls = {
        "vocab_parallel_logprobs": lambda **kw: dt.vocab_parallel_logprobs(shard, ids, **kw),
        "vocab_parallel_cross_entropy":
            lambda **kw: dt.vocab_parallel_cross_entropy(shard, ids, **kw),
        "vocab_parallel_log_probs_from_logits":
            lambda **kw: dt.vocab_parallel_log_probs_from_logits(shard, ids, **kw),
        "vocab_parallel_entropy": lambda **kw: dt.vocab_parallel_entropy(shard, **kw),
        "fused_linear_logprobs":
            lambda **kw: detlogp.fused_linear_logprobs(hidden, weight, ids.reshape(-1), **kw)[0],
    }
    for name, call in calls.items():
        out[f"{name} without group"] = _attempt(call)
        out[f"{name} group=2"] = _attempt(lambda call=call: call(group=2))
        out[f"{name} with group"] = _attempt(lambda call=call: call(group=dist.group.WORLD))
    # The whole vocabulary on every rank: verl's logprobs_from_logits needs no group, and
    # vocab_parallel_logprobs says so with group=detlogp.SelfComm().
    out["logprobs_from_logits"] = _attempt(lambda: dt.logprobs_from_logits(full, ids))
    out["self"] = _attempt(lambda: dt.vocab_parallel_logprobs(full, ids,
                                                              group=detlogp.SelfComm()))
    # An explicit contract says its TP size itself: no group to infer.
    one_rank = detlogp.LogprobContract(
        role="train", dtype="fp32", mask=detlogp.MaskSpec.all_active(S * B),
        sharding=detlogp.ShardingSpec(tp_rank=0, tp_world_size=1, vocab_shard_bounds=[(0, V)],
                                      real_vocab_size=V, padded_vocab_size=V))
    out["fused contract"] = _attempt(lambda: detlogp.fused_linear_logprobs(
        hidden, full_weight, ids.reshape(-1), contract=one_rank)[0])
    out["fused self"] = _attempt(lambda: detlogp.fused_linear_logprobs(
        hidden, full_weight, ids.reshape(-1), group=detlogp.SelfComm())[0])
    dist.barrier()
    # Rank 1 forgets group=; rank 0 passes its TP group (with a short collective timeout).
    if rank == 1:
        out["peer forgot group"] = _attempt(lambda: dt.vocab_parallel_logprobs(shard, ids))
        time.sleep(8)  # alive, as a trainer would be, past its peer's timeout
    else:
        comm = detlogp.TorchDistributedComm(lonely, timeout=3)
        out["peer forgot group"] = _attempt(
            lambda: dt.vocab_parallel_logprobs(shard, ids, group=comm))
    return out


def _importable(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


def main(rank, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    import torch.distributed as dist

    from spawn import gloo_rank

    def body():
        lonely = dist.new_group([0, 1])  # used only where one rank never joins
        return _scenarios(rank, lonely)

    gloo_rank(rank, TP, init_file, out_dir, body, teardown=False)
    os._exit(0)  # the collective rank 1 never joined would keep the group's teardown waiting
