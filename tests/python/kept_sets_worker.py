"""One rank of test_kept_sets.py's TP runs: `world` TP ranks (gloo) score the same logical
logits [b, s, v] with the same kept sets (rank 0 reads Megatron's transposed view, the others
the contiguous one; each rank lists the ids in its own order), then with a different set on the
last rank. Writes to <out>/rank<r>.pt: logp, entropy and the gradient of its shard (or the
error), and the TP=1 values of the whole logits."""

import sys

S, B, REAL, V = 5, 3, 1000, 1024
K = 40


def _run(leaf, view_of, targets, kept, group, temperature=1.0):
    import detlogp.torch as dt

    x = leaf.clone().requires_grad_()
    try:
        logp, ent = dt.vocab_parallel_logprobs(view_of(x), targets, group=group, real_vocab=REAL,
                                               entropy=True, kept_ids=kept, softcap=20.0,
                                               temperature=temperature)
    except Exception as e:  # noqa: BLE001 - recorded for the parent's assertion
        return {"error": f"{type(e).__name__}: {e}", "field": getattr(e, "field", None)}
    (logp.sum() + 0.5 * ent.sum()).backward()
    return {"logp": logp.detach(), "entropy": ent.detach(),
            "grad": view_of(x.grad).contiguous()}


def kept_sets(ids, gen, k=K, real=REAL):
    """Per token `k` slots: the target, distinct random ids, -1 padding, shuffled."""
    import torch

    out = torch.full(tuple(ids.shape) + (k,), -1, dtype=torch.int64)
    flat_ids, flat = ids.reshape(-1), out.view(-1, k)
    for t in range(flat.shape[0]):
        n = int(torch.randint(1, k + 1, (1,), generator=gen))
        others = torch.randperm(real, generator=gen)[: n + 1]
        chosen = [int(flat_ids[t])] + [int(v) for v in others if int(v) != int(flat_ids[t])]
        flat[t, :n] = torch.tensor(chosen[:n])
        flat[t] = flat[t, torch.randperm(k, generator=gen)]
    return out


def _scenarios(rank, world, group):
    import torch

    import detlogp

    g = torch.Generator().manual_seed(0)  # the same on every rank
    full_sbv = torch.randn(S, B, V, generator=g) * 6  # Megatron's [s, b, v]
    full = full_sbv.transpose(0, 1).contiguous()  # the logical [b, s, v]
    ids = torch.randint(0, REAL, (B, S), generator=g)
    kept = kept_sets(ids, g)
    temps = torch.tensor([0.5, 1.0, 2.0])[torch.randint(0, 3, (B, S), generator=g)]
    # This rank's order of each set.
    mine = kept[..., torch.randperm(K, generator=torch.Generator().manual_seed(rank + 1))]
    w = V // world
    s, e = rank * w, (rank + 1) * w
    out = {}
    if rank == 0:
        out["tp"] = _run(full_sbv, lambda x: x[..., s:e].transpose(0, 1), ids, mine, group,
                         temps)
    else:
        out["tp"] = _run(full, lambda x: x[..., s:e], ids, mine, group, temps)
    ref = _run(full, lambda x: x, ids, kept, detlogp.SelfComm(), temps)
    ref["grad"] = ref["grad"][..., s:e].contiguous()
    out["reference"] = ref
    other = kept.clone()
    if rank == world - 1:
        other[1, 2] = torch.where(other[1, 2] == ids[1, 2], ids[1, 2], -1)
    out["different sets"] = _run(full, lambda x: x[..., s:e], ids, other, group, temps)
    out["after"] = _run(full, lambda x: x[..., s:e], ids, kept, group, temps)
    return out


def main(rank, world, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    import torch.distributed as dist

    import detlogp
    from spawn import gloo_rank

    gloo_rank(rank, world, init_file, out_dir,
              lambda: _scenarios(rank, world,
                                 detlogp.TorchDistributedComm(dist.group.WORLD, timeout=30)))
