"""One rank of test_unaligned_bounds_tp.py: three TP ranks (gloo) with shard bounds that are not
multiples of the tile width: vLLM's layout of Qwen3's vocabulary (151936 columns, ranks of 50646
columns: a vocab_start table) in bf16 and fp32, even shards of 1000 columns (inferred), then a
rank whose table disagrees. Writes what it saw to <out>/rank<r>.pt: logp, entropy and the
gradient of the rank's columns (or the error), and the TP=1 values of the whole logits."""

import sys

TP, ROWS = 3, (2, 3)


def _vllm_bounds(real, tp):
    padded = (real + 63) // 64 * 64
    per = -(-padded // tp)
    return [(min(r * per, padded), min((r + 1) * per, padded)) for r in range(tp)], padded


def _run(x_full, s, e, targets, group, **kw):
    import detlogp.torch as dt

    x = x_full[..., s:e].clone().requires_grad_()
    try:
        logp, ent = dt.vocab_parallel_logprobs(x, targets, group=group, entropy=True, **kw)
    except Exception as e:  # noqa: BLE001 - recorded for the parent's assertion
        return {"error": f"{type(e).__name__}: {e}", "field": getattr(e, "field", None)}
    (logp.sum() + 0.5 * ent.sum()).backward()
    return {"logp": logp.detach(), "entropy": ent.detach(), "grad": x.grad}


def _case(rank, group, full, ids, bounds, real, **kw):
    import detlogp

    s, e = bounds[rank]
    table = kw.pop("table", True)
    vocab_start = bounds if table else None
    got = _run(full, s, e, ids, group, real_vocab=real, vocab_start=vocab_start, **kw)
    ref = _run(full, 0, full.shape[-1], ids, detlogp.SelfComm(), real_vocab=real, **kw)
    ref["grad"] = ref["grad"][..., s:e].contiguous()
    return got, ref


def _scenarios(rank, group):
    import torch

    g = torch.Generator().manual_seed(0)  # the same on every rank
    out = {}
    real = 151936
    bounds, padded = _vllm_bounds(real, TP)
    ids = torch.randint(0, real, ROWS, generator=g)
    for dtype in (torch.bfloat16, torch.float32):
        full = (torch.randn(*ROWS, padded, generator=g) * 4).to(dtype)
        name = f"vllm {str(dtype)[6:]}"
        out[name], out[name + " reference"] = _case(rank, group, full, ids, bounds, real)
    # Even shards of 1000 columns, inferred from the logits' width (not a multiple of 128).
    even = [(r * 1000, (r + 1) * 1000) for r in range(TP)]
    full = torch.randn(*ROWS, 3000, generator=g) * 4
    ids_even = torch.randint(0, 2900, ROWS, generator=g)
    out["even"], out["even reference"] = _case(rank, group, full, ids_even, even, 2900,
                                               table=False, softcap=20.0, temperature=0.7)
    # A rank whose table disagrees: every rank fails, and the group works afterwards.
    other = [(0, 50646), (50646, 101293), (101293, 151936)] if rank == 2 else bounds
    full = torch.randn(*ROWS, padded, generator=g)
    s, e = other[rank]
    out["disagree"] = _run(full, s, e, ids, group, real_vocab=real, vocab_start=other)
    return out


def main(rank, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    import torch.distributed as dist

    import detlogp
    from spawn import gloo_rank

    gloo_rank(rank, TP, init_file, out_dir,
              lambda: _scenarios(rank, detlogp.TorchDistributedComm(dist.group.WORLD, timeout=30)))
