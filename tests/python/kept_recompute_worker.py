"""One rank of test_kept_recompute.py's TP runs: `world` TP ranks (gloo) score the same logical
logits [b, s, v] with per-token top_k / top_p (rank 0 reads Megatron's transposed view, the
others the contiguous one), then with the kept sets it got back as kept_ids, then with a top_k
that differs on the last rank. Writes to <out>/rank<r>.pt: logp, entropy, the kept sets and the
gradient of its shard (or the error), and the TP=1 values of the whole logits."""

import sys

S, B, REAL, V = 5, 3, 1000, 1024


def parameters(g):
    """Per-token top_k and top_p: top-k alone, top-p alone (the full LSE) and both."""
    import torch

    top_k = torch.tensor([0, 1, 5, 40, 200, 0])[torch.randint(0, 6, (B, S), generator=g)]
    top_p = torch.tensor([0.9, 0.5, 1.0, 0.97])[torch.randint(0, 4, (B, S), generator=g)]
    top_p = torch.where(top_k == 0, torch.clamp(top_p, max=0.95), top_p)
    return top_k.to(torch.int32), top_p.to(torch.float32)


def run(leaf, view_of, targets, group, **kw):
    import detlogp.torch as dt

    x = leaf.clone().requires_grad_()
    try:
        logp, ent, kept = dt.vocab_parallel_logprobs(
            view_of(x), targets, group=group, real_vocab=REAL, entropy=True, softcap=20.0,
            outside_kept="neg_inf", return_kept=True, **kw)
    except Exception as e:  # noqa: BLE001 - recorded for the parent's assertion
        return {"error": f"{type(e).__name__}: {e}", "field": getattr(e, "field", None)}
    g = torch_where_finite(logp)
    (g.sum() + 0.5 * ent.sum()).backward()
    return {"logp": logp.detach(), "entropy": ent.detach(), "kept": kept,
            "grad": view_of(x.grad).contiguous()}


def torch_where_finite(logp):
    import torch

    return torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))


def _scenarios(rank, world, group):
    import torch

    import detlogp

    g = torch.Generator().manual_seed(0)  # the same on every rank
    full_sbv = torch.randn(S, B, V, generator=g) * 4  # Megatron's [s, b, v]
    full = full_sbv.transpose(0, 1).contiguous()  # the logical [b, s, v]
    ids = torch.randint(0, REAL, (B, S), generator=g)
    top_k, top_p = parameters(g)
    ref = run(full, lambda x: x, ids, detlogp.SelfComm(), top_k=top_k, top_p=top_p)
    targets = ref["kept"][..., 0].clone()  # each token's lowest kept id: inside its set
    targets[0, 1] = REAL - 1  # most likely outside: -inf
    ref = run(full, lambda x: x, targets, detlogp.SelfComm(), top_k=top_k, top_p=top_p)
    w = V // world
    s, e = rank * w, (rank + 1) * w
    ref["grad"] = ref["grad"][..., s:e].contiguous()
    out = {"reference": ref}
    if rank == 0:
        out["tp"] = run(full_sbv, lambda x: x[..., s:e].transpose(0, 1), targets, group,
                        top_k=top_k, top_p=top_p)
    else:
        out["tp"] = run(full, lambda x: x[..., s:e], targets, group, top_k=top_k, top_p=top_p)
    out["given"] = run(full, lambda x: x[..., s:e], targets, group, kept_ids=ref["kept"])
    other = top_k.clone()
    if rank == world - 1:
        other[1, 2] = 7
    out["different top_k"] = run(full, lambda x: x[..., s:e], targets, group, top_k=other,
                                 top_p=top_p)
    out["after"] = run(full, lambda x: x[..., s:e], targets, group, top_k=top_k, top_p=top_p)
    return out


def main(rank, world, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    import torch.distributed as dist

    import detlogp
    from spawn import gloo_rank

    gloo_rank(rank, world, init_file, out_dir,
              lambda: _scenarios(rank, world,
                                 detlogp.TorchDistributedComm(dist.group.WORLD, timeout=30)))
