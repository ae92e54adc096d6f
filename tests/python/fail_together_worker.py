"""One rank of test_fail_together.py: in a gloo world of 2, rank 1 raises while preparing a
call (an exception of any type, not only a contract error) on every entry point, and rank 0
records what it saw and how long it waited. Writes <out>/rank<r>.pt."""

import sys

from spawn import record_failure

N, H, LOCAL, REAL = 6, 8, 128, 250


def _scenarios(rank):
    import torch
    import torch.distributed as dist

    import detlogp
    import detlogp.torch as dt

    world = dist.group.WORLD
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, H, generator=g)
    weight = torch.randn(2 * LOCAL, H, generator=g)[rank * LOCAL:(rank + 1) * LOCAL]
    targets = torch.randint(0, REAL, (N,), generator=g)
    logits = torch.randn(N, 2 * LOCAL, generator=g)[:, rank * LOCAL:(rank + 1) * LOCAL]
    bad = rank == 1

    def fused(t, **kw):
        return detlogp.fused_linear_logprobs(hidden, weight, t, group=world, real_vocab=REAL,
                                             **kw)

    out = {}
    record_failure(out, "fused meta targets",
            lambda: fused(targets.to("meta") if bad else targets))
    record_failure(out, "fused sparse targets",
            lambda: fused(targets.to_sparse() if bad else targets))
    record_failure(out, "fused threads=-1", lambda: fused(targets, threads=-1 if bad else 0))
    record_failure(out, "fused grad, meta targets",
            lambda: detlogp.fused_linear_logprobs(
                hidden.clone().requires_grad_(), weight, targets.to("meta") if bad else targets,
                group=world, real_vocab=REAL))
    record_failure(out, "torch API meta targets",
            lambda: dt.vocab_parallel_logprobs(logits, targets.to("meta") if bad else targets,
                                               group=world, real_vocab=REAL))
    c = dt.vocab_parallel_logprobs(logits, targets, group=world, real_vocab=REAL,
                                   return_contract=True)[-1]
    op = detlogp.get_logprob_op(c).op
    record_failure(out, "op sparse targets",
            lambda: op(logits, targets.to_sparse() if bad else targets, contract=c, group=world))
    out["fused after failures"] = fused(targets)[0]  # the group still works
    return out


def main(rank, world, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    from spawn import gloo_rank

    gloo_rank(rank, world, init_file, out_dir, lambda: _scenarios(rank))
