"""One rank of test_row_temperature_tp.py: two TP ranks (gloo) pass per-token temperatures
with the same logical logits in different memory layouts (rank 0 Megatron's transposed view,
rank 1 contiguous), and then different temperatures. Writes what it saw to <out>/rank<r>.pt:
logp, entropy and its gradient (or the error), and the TP=1 values of the whole logits."""

import sys

S, B, REAL, V, TP = 5, 3, 1000, 1024, 2
W = V // TP


def _run(leaf, view_of, targets, temperature, group):
    import detlogp.torch as dt

    x = leaf.clone().requires_grad_()
    try:
        logp, ent = dt.vocab_parallel_logprobs(view_of(x), targets, group=group, real_vocab=REAL,
                                               temperature=temperature, entropy=True)
    except Exception as e:  # noqa: BLE001 - recorded for the parent's assertion
        return {"error": f"{type(e).__name__}: {e}", "field": getattr(e, "field", None)}
    (logp.sum() + 0.5 * ent.sum()).backward()
    return {"logp": logp.detach(), "entropy": ent.detach(),
            "grad": view_of(x.grad).contiguous()}


def _scenarios(rank, group):
    import torch

    import detlogp

    g = torch.Generator().manual_seed(0)  # the same on every rank
    full_sbv = torch.randn(S, B, V, generator=g) * 6  # Megatron's [s, b, v]
    full = full_sbv.transpose(0, 1).contiguous()  # the logical [b, s, v]
    ids = torch.randint(0, REAL, (B, S), generator=g)
    temps = torch.tensor([0.5, 1.0, 2.0])[torch.randint(0, 3, (B, S), generator=g)]
    s, e = rank * W, (rank + 1) * W
    out = {}
    if rank == 0:
        out["mixed layouts"] = _run(full_sbv, lambda x: x[..., s:e].transpose(0, 1), ids, temps,
                                    group)
    else:
        out["mixed layouts"] = _run(full, lambda x: x[..., s:e], ids, temps, group)
    ref = _run(full, lambda x: x, ids, temps, detlogp.SelfComm())
    ref["grad"] = ref["grad"][..., s:e].contiguous()
    out["reference"] = ref
    other = temps.clone()
    if rank == 1:
        other[2, 4] = 0.75
    out["different temperatures"] = _run(full, lambda x: x[..., s:e], ids, other, group)
    out["after"] = _run(full, lambda x: x[..., s:e], ids, temps, group)
    return out


def main(rank, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    import torch.distributed as dist

    import detlogp
    from spawn import gloo_rank

    gloo_rank(rank, TP, init_file, out_dir,
              lambda: _scenarios(rank, detlogp.TorchDistributedComm(dist.group.WORLD, timeout=30)))
