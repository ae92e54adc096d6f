"""One rank of test_fused_dropin.py's TP cases: ``fused_vocab_parallel_logprobs`` over gloo
with this rank's rows of one lm_head weight (even shards, a vocab_start table of uneven ones,
or a DTensor weight), on the causal-shift view of [B, S, H] hidden states with a loss_mask,
ignore_index, per-token temperatures, softcap and entropy. Writes logp, entropy and the
gradients of the hidden states and of this rank's weight rows to <out>/rank<r>.pt."""

import sys

B, S, H, V, REAL = 3, 6, 40, 512, 500


def problem():
    """The same inputs on every rank and in the parent (the TP=1 reference)."""
    import torch

    g = torch.Generator().manual_seed(11)
    hidden = torch.randn(B, S, H, generator=g)
    weight = torch.randn(V, H, generator=g) * 0.4
    ids = torch.randint(0, REAL, (B, S), generator=g)
    ids[1, 3] = -100  # ignore_index
    mask = torch.rand(B, S - 1, generator=g) > 0.2
    temps = torch.tensor([0.5, 1.0, 2.0])[torch.randint(0, 3, (B, S - 1), generator=g)]
    return hidden, weight, ids, mask, temps


def _local(x):
    return x.to_local() if hasattr(x, "to_local") else x


def run(hidden, weight, group, mesh=None, **kwargs):
    """The call on the causal shift of ``hidden`` and backward of a loss over logp and
    entropy: (logp, entropy, grad_hidden, grad of the weight given). ``mesh``: hidden as a
    DTensor replicated on it (the outputs then DTensors)."""
    import torch

    from detlogp.torch import fused_vocab_parallel_logprobs

    _, _, ids, mask, temps = problem()
    h = hidden.clone().requires_grad_()
    if mesh is not None:
        from torch.distributed.tensor import Replicate, distribute_tensor

        h = distribute_tensor(hidden, mesh, [Replicate()]).requires_grad_()
    w = weight.detach().clone().requires_grad_() if not hasattr(weight, "device_mesh") else \
        weight
    logp, ent = fused_vocab_parallel_logprobs(
        h[:, :-1], w, ids[:, 1:], group=group, real_vocab=REAL, loss_mask=mask,
        temperature=temps, softcap=30.0, entropy=True, **kwargs)
    if mesh is not None:
        assert hasattr(logp, "to_local") and tuple(logp.shape) == (B, S - 1)
        logp, ent = logp.to_local(), ent.to_local()
    coef = torch.linspace(-1, 1, logp.numel()).view(logp.shape)
    ((coef * logp).sum() + 0.25 * ent.sum()).backward()
    return {"logp": logp.detach(), "entropy": ent.detach(), "grad_hidden": _local(h.grad),
            "grad_weight": _local(w.grad)}


def _scenarios(rank, world):
    import torch.distributed as dist

    hidden, weight, _, _, _ = problem()
    group = dist.group.WORLD
    out = {}
    local = V // world
    out["even"] = run(hidden, weight[rank * local:(rank + 1) * local], group)
    if world == 2:  # uneven shards: rank 0 holds 384 rows, rank 1 128
        table = [(0, 384), (384, V)]
        s, e = table[rank]
        out["table"] = run(hidden, weight[s:e], group, vocab_start=table)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (world,))
        wd = distribute_tensor(weight, mesh, [Shard(0)]).requires_grad_()
        out["dtensor"] = run(hidden, wd, None)
        wd = distribute_tensor(weight, mesh, [Shard(0)]).requires_grad_()
        out["dtensor hidden"] = run(hidden, wd, None, mesh=mesh)
    return out


def main(rank, world, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    from spawn import gloo_rank

    gloo_rank(rank, world, init_file, out_dir, lambda: _scenarios(rank, world))
