"""One rank of test_fused_unaligned_bounds_tp.py: three TP ranks (gloo) running the fused
lm_head with shard bounds that are not multiples of the tile width: vLLM's layout of Qwen3's
vocabulary (151936 rows, ranks of 50646: a vocab_start table) through
``fused_vocab_parallel_logprobs`` in bf16 and fp32 and through ``fused_linear_logprobs``; even
shards of 1000 rows (inferred from the weight) with softcap and temperature; a DTensor weight
split unevenly; then a rank whose table disagrees. Writes what it saw to <out>/rank<r>.pt:
logp, entropy (and LSE), the gradients of the hidden states and of its weight rows (or the
error)."""

import sys

TP, B, S, H = 3, 2, 4, 16
REAL = 151936


def vllm_bounds(real, tp):
    """vLLM's layout: the vocabulary padded to a multiple of 64, ceil(P / TP) rows per rank."""
    padded = (real + 63) // 64 * 64
    per = -(-padded // tp)
    return [(min(r * per, padded), min((r + 1) * per, padded)) for r in range(tp)], padded


def problem(dtype, rows):
    """The same inputs on every rank and in the parent (the TP=1 reference)."""
    import torch

    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(B, S, H, generator=g).to(dtype)
    weight = (torch.randn(rows, H, generator=g) * 0.5).to(dtype)
    ids = torch.randint(0, min(rows, REAL), (B, S), generator=g)
    return hidden, weight, ids


def run(hidden, weight, ids, group, *, linear=False, **kwargs):
    """The call and backward of a loss over its outputs: logp, entropy (and lse), grad_hidden,
    the grad of the weight given; or the error."""
    import torch

    import detlogp
    from detlogp.torch import fused_vocab_parallel_logprobs

    h = hidden.clone().requires_grad_()
    w = weight if hasattr(weight, "device_mesh") else weight.detach().clone().requires_grad_()
    try:
        if linear:
            logp, lse, ent = detlogp.fused_linear_logprobs(
                h.reshape(-1, H), w, ids.reshape(-1), group=group, entropy=True, **kwargs)
            loss = logp.sum() + 0.3 * lse.sum() + 0.25 * ent.sum()
        else:
            logp, ent = fused_vocab_parallel_logprobs(h, w, ids, group=group, entropy=True,
                                                      **kwargs)
            lse = None
            loss = (torch.linspace(-1, 1, logp.numel()).view(logp.shape) * logp).sum() + \
                0.25 * ent.sum()
    except Exception as e:  # noqa: BLE001 - recorded for the parent's assertion
        return {"error": f"{type(e).__name__}: {e}"}
    loss.backward()
    gw = w.grad.to_local() if hasattr(w.grad, "to_local") else w.grad
    return {"logp": logp.detach(), "entropy": ent.detach(),
            "lse": None if lse is None else lse.detach(), "grad_hidden": h.grad,
            "grad_weight": gw}


def _scenarios(rank):
    import torch
    import torch.distributed as dist

    group = dist.group.WORLD
    out = {}
    bounds, padded = vllm_bounds(REAL, TP)
    s, e = bounds[rank]
    for dtype in (torch.bfloat16, torch.float32):
        hidden, weight, ids = problem(dtype, padded)
        name = str(dtype)[6:]
        out[f"vllm {name}"] = run(hidden, weight[s:e], ids, group, vocab_start=bounds)
    hidden, weight, ids = problem(torch.float32, padded)
    out["linear"] = run(hidden, weight[s:e], ids, group, linear=True, vocab_start=bounds)
    # Even shards of 1000 rows (not a multiple of 128), inferred from the weight's rows.
    hidden, weight, ids = problem(torch.float32, 3000)
    out["even"] = run(hidden, weight[rank * 1000:(rank + 1) * 1000], ids, group,
                      real_vocab=2900, softcap=20.0, temperature=0.7)
    # A DTensor weight split unevenly by the mesh (torch's Shard(0): 1000, 1000, 1000).
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (TP,))
    wd = distribute_tensor(weight, mesh, [Shard(0)]).requires_grad_()
    out["dtensor"] = run(hidden, wd, ids, None, real_vocab=2900)
    # A rank whose table disagrees: every rank fails.
    hidden, weight, ids = problem(torch.float32, padded)
    other = [(0, 50646), (50646, 101293), (101293, 151936)] if rank == 2 else bounds
    s, e = other[rank]
    out["disagree"] = run(hidden, weight[s:e], ids, group, vocab_start=other)
    return out


def main(rank, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    from spawn import gloo_rank

    gloo_rank(rank, TP, init_file, out_dir, lambda: _scenarios(rank))
