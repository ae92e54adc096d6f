"""One rank of test_torch_distributed.py: detlogp.torch over gloo in a world of 4.

Every rank runs every scenario in the same order and writes what it saw to <out>/rank<r>.pt:
outputs and gradients of TP = 1, 2 (two groups) and 4 calls, a GRPO loop's losses and
weights at each TP degree, and the message (and elapsed time) of every expected failure.
"""

import sys

from spawn import record_failure

B, S, H, REAL, V = 2, 9, 16, 1000, 1024


def _data(dtype):
    import torch

    g = torch.Generator().manual_seed(0)  # the same on every rank
    full = (torch.randn(B, S, V, generator=g) * 3).to(dtype)
    ids = torch.randint(0, REAL, (B, S), generator=g)
    ids[0, 3] = -100
    mask = torch.ones(B, S)
    mask[1, :2] = 0  # the prompt of sequence 1 (a float mask, like verl's)
    return full, ids, mask


def _groups(rank):
    import torch.distributed as dist

    import detlogp

    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates both
    # TP=1 under torch.distributed: each rank says it holds the whole vocabulary.
    return {1: (detlogp.SelfComm(), 0), 2: (pairs[rank // 2], rank % 2),
            4: (dist.group.WORLD, rank)}


def _shard(tp, tp_rank):
    w = V // tp
    return tp_rank * w, (tp_rank + 1) * w


def _logprobs_at(tp, groups, dtype, group_override=None):
    """logp, entropy and the gradient of this rank's columns for the shifted N-D logits."""
    import torch

    import detlogp.torch as dt

    group, tp_rank = groups[tp]
    full, ids, mask = _data(dtype)
    s, e = _shard(tp, tp_rank)
    leaf = full.clone().requires_grad_()
    local = leaf[..., s:e][:, :-1]  # a column slice, then the causal shift: both views
    logp, ent, contract = dt.vocab_parallel_logprobs(
        local, ids[:, 1:], group=group_override or group, real_vocab=REAL,
        loss_mask=mask[:, 1:], entropy=True, return_contract=True)
    g = torch.Generator().manual_seed(1)
    w1, w2 = torch.randn(B, S - 1, generator=g), torch.randn(B, S - 1, generator=g)
    ((w1 * logp).sum() + (w2 * ent).sum()).backward()
    return {"logp": logp.detach(), "entropy": ent.detach(),
            "grad": leaf.grad[..., s:e].contiguous(), "bounds": contract.sharding.vocab_shard_bounds,
            "fingerprint": contract.cross_rank_fingerprint()}


def _grpo(tp, groups, dtype, steps=3):
    """A GRPO loop on this rank's shard of an LM head: losses and the final weight shard."""
    import torch

    import detlogp.torch as dt

    group, tp_rank = groups[tp]
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(B, S, H, generator=g).to(dtype)
    weight = (torch.randn(V, H, generator=g) * 0.5).to(dtype)
    ids = torch.randint(0, REAL, (B, S), generator=g)
    advantages = torch.randn(B, 1, generator=g)
    mask = torch.ones(B, S - 1)
    mask[:, :3] = 0  # prompt tokens
    s, e = _shard(tp, tp_rank)
    w_local = weight[s:e].clone().requires_grad_()
    opt = torch.optim.SGD([w_local], lr=0.5)
    losses = []
    for _ in range(steps):
        with torch.no_grad():
            old = dt.vocab_parallel_logprobs((hidden @ w_local.t())[:, :-1], ids[:, 1:],
                                             group=group, real_vocab=REAL, loss_mask=mask)
        for _ in range(2):  # two updates per rollout: the ratio moves off 1
            logits = hidden @ w_local.t()
            new, ent = dt.vocab_parallel_logprobs(logits[:, :-1], ids[:, 1:], group=group,
                                                  real_vocab=REAL, loss_mask=mask, entropy=True)
            ratio = torch.exp(new - old)
            surrogate = torch.min(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
            loss = -((surrogate + 0.01 * ent) * mask).sum() / mask.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
    return {"losses": torch.stack(losses), "weight": w_local.detach().clone()}


def _failures(rank, out):
    import torch
    import torch.distributed as dist

    import detlogp.torch as dt

    world = dist.group.WORLD
    full, ids, mask = _data(torch.float32)
    s, e = _shard(4, rank)
    local = full[..., s:e]

    def call(**kw):
        args = dict(group=world, real_vocab=REAL, loss_mask=mask)
        args.update(kw)
        x = args.pop("x", local)
        t = args.pop("t", ids)
        return dt.vocab_parallel_logprobs(x, t, **args)

    odd = rank == 1
    other_mask = mask.clone()
    other_mask[0, 5] = 0
    other_ids = ids.clone()
    other_ids[1, 6] = (ids[1, 6] + 1) % REAL
    cases = {
        "mask": dict(loss_mask=other_mask if odd else mask),
        "sharding": dict(real_vocab=REAL + 1 if odd else REAL),
        "reduction": dict(deterministic=not odd),
        "temperature": dict(temperature=0.5 if odd else 1.0),
        "tile width": dict(tile_width=64 if odd else 128),
        "row count": dict(x=local[:1] if odd else local, t=ids[:1] if odd else ids,
                          loss_mask=mask[:1] if odd else mask),
        "targets": dict(t=other_ids if odd else ids),
        "dtype": dict(x=local.bfloat16() if odd else local),
    }
    for part, kw in cases.items():
        record_failure(out, "mismatch " + part, lambda kw=kw: call(**kw))

    meta = torch.empty(B, S, V // 4, device="meta")
    record_failure(out, "meta tensor on rank 2", lambda: call(x=meta if rank == 2 else local))

    original = dt.active_tokens  # the mask rule (_torch_args.py) as detlogp.torch calls it

    def broken(*a, **k):
        raise ValueError("boom on rank 1")

    def value_error():
        dt.active_tokens = broken if rank == 1 else original
        try:
            call()
        finally:
            dt.active_tokens = original

    record_failure(out, "ValueError on rank 1", value_error)

    def contract_api_error():  # the contract API: a TypeError on rank 3 while preparing
        import detlogp
        import detlogp._op as dop

        c = dt.vocab_parallel_logprobs(local, ids, group=world, return_contract=True)[-1]
        op = detlogp.get_logprob_op(c).op
        original_targets = dop.int64_targets

        def broken_targets(t):
            raise TypeError("bad targets on rank 3")

        dop.int64_targets = broken_targets if rank == 3 else original_targets
        try:
            op(local.reshape(-1, local.shape[-1]), ids.reshape(-1), contract=c, group=world)
        finally:
            dop.int64_targets = original_targets

    record_failure(out, "contract API TypeError on rank 3", contract_api_error)
    out["after failures"] = call().detach()  # the group still works


def _scenarios(rank):
    import torch
    import torch.distributed as dist

    import detlogp

    out = {}
    groups = _groups(rank)
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).split(".")[-1]
        for tp in (1, 2, 4):
            out[f"logprobs {name} tp{tp}"] = _logprobs_at(tp, groups, dtype)
        for tp in (1, 2, 4):
            out[f"grpo {name} tp{tp}"] = _grpo(tp, groups, dtype)
    # The device path of the transport (what an NCCL group takes), with the CPU as device.
    device_comm = detlogp.TorchDistributedComm(dist.group.WORLD, device=torch.device("cpu"))
    out["logprobs float32 tp4 device path"] = _logprobs_at(4, groups, torch.float32,
                                                          group_override=device_comm)
    _failures(rank, out)
    return out


def main(rank, world, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    from spawn import gloo_rank

    gloo_rank(rank, world, init_file, out_dir, lambda: _scenarios(rank))
