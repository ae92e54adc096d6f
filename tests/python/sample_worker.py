"""One rank of test_sample.py's TP=3 cases: three TP ranks (gloo) sample at vLLM's layout (the
vocabulary of 1000 ids padded to 1024, ranks of 342 columns: bounds that are not multiples of
the tile width, a vocab_start table) with per-row seeds, positions, temperatures (greedy rows
among them), top_k and top_p (restricted and unrestricted rows mixed) and num_logprobs; the same
call on the whole logits at TP=1; the trainer's vocab_parallel_logprobs of the sampled tokens at
the same layout; then ranks that disagree on the seeds, and a rank with a bad position. Writes
what it saw to <out>/rank<r>.pt."""

import sys

TP, ROWS, REAL = 3, 10, 1000


def _vllm_bounds(real, tp):
    padded = (real + 63) // 64 * 64
    per = -(-padded // tp)
    return [(min(r * per, padded), min((r + 1) * per, padded)) for r in range(tp)], padded


def _params(torch):
    return dict(
        temperature=torch.tensor([1.0, 0.7, 0.0, 1.3, 1.0, 0.5, 0.0, 2.0, 0.9, 1.1]),
        top_k=torch.tensor([0, 50, 0, 0, 5, 0, 3, 0, 1, 0], dtype=torch.int32),
        top_p=torch.tensor([1.0, 1.0, 0.9, 1.0, 0.8, 0.3, 1.0, 0.95, 1.0, 1.0]))


def _outputs(out):
    return {name: getattr(out, name) for name in out._fields}


def _record(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - recorded for the parent's assertion
        return {"error": f"{type(e).__name__}: {e}", "field": getattr(e, "field", None)}


def _scenarios(rank, group):
    import torch

    import detlogp
    from detlogp.torch import vocab_parallel_logprobs

    g = torch.Generator().manual_seed(0)  # the same on every rank
    bounds, padded = _vllm_bounds(REAL, TP)
    s, e = bounds[rank]
    seeds = torch.randint(-2**62, 2**62, (ROWS,), generator=g)
    positions = torch.randint(0, 5000, (ROWS,), generator=g)
    p = _params(torch)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype)[6:]
        full = (torch.randn(ROWS, padded, generator=g) * 3).to(dtype)
        kw = dict(p, real_vocab=REAL, num_logprobs=4)
        got = detlogp.sample(full[:, s:e], seeds, positions, group=group, vocab_start=bounds,
                             **kw)
        ref = detlogp.sample(full[:, :REAL], seeds, positions, **kw)
        out[name] = _outputs(got)
        out[name + " reference"] = _outputs(ref)
        # The trainer at the same layout: full rows at the rows' temperatures (greedy: 1), the
        # restricted rows with top_k / top_p recomputed, and with the sampler's kept sets.
        tau = torch.where(p["temperature"] == 0, torch.ones(ROWS), p["temperature"])
        r = (p["top_k"] > 0) | (p["top_p"] < 1)
        shard = full[:, s:e]
        train = dict(group=group, vocab_start=bounds, real_vocab=REAL)
        out[name + " trainer"] = {
            "full": vocab_parallel_logprobs(shard, got.tokens, temperature=tau, **train),
            "recomputed": vocab_parallel_logprobs(
                shard[r], got.tokens[r], temperature=tau[r], top_k=p["top_k"][r],
                top_p=p["top_p"][r], **train),
            "kept": vocab_parallel_logprobs(shard[r], got.tokens[r], temperature=tau[r],
                                            kept_ids=got.kept[r], **train),
            "restricted": r}
    full = torch.randn(ROWS, padded, generator=g)
    other = seeds.clone()
    if rank == 2:
        other[3] += 1
    out["disagree"] = _record(lambda: detlogp.sample(
        full[:, s:e], other, positions, group=group, vocab_start=bounds, real_vocab=REAL))
    bad = positions.clone()
    if rank == 1:
        bad[4] = -3
    out["bad position"] = _record(lambda: detlogp.sample(
        full[:, s:e], seeds, bad, group=group, vocab_start=bounds, real_vocab=REAL))
    # The group still works afterwards.
    out["after"] = _outputs(detlogp.sample(full[:, s:e], seeds, positions, group=group,
                                           vocab_start=bounds, real_vocab=REAL))
    return out


def main(rank, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    import torch.distributed as dist

    import detlogp
    from spawn import gloo_rank

    gloo_rank(rank, TP, init_file, out_dir,
              lambda: _scenarios(rank, detlogp.TorchDistributedComm(dist.group.WORLD, timeout=30)))
