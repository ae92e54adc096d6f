"""One rank of test_concurrent_calls.py: in a gloo world of 2, two threads of each rank (a
policy and a reference model) score their logits on the one TP group at the same time, several
rounds, released together by a barrier each round. Every call's outcome (its logp, or the
error's message) goes to <out>/rank<r>.pt, with what the same calls give one after another."""

import sys
import threading

LOCAL, REAL, ROUNDS = 128, 250, 8


def _inputs(rank, shapes):
    import torch

    g = torch.Generator().manual_seed(3)  # the same full logits on every rank
    out = {}
    for name, (b, s) in shapes.items():
        full = torch.randn(b, s, 2 * LOCAL, generator=g) * 2  # each model its own logits
        ids = torch.randint(0, REAL, (b, s), generator=torch.Generator().manual_seed(4))
        out[name] = (full[..., rank * LOCAL:(rank + 1) * LOCAL], ids)
    return out


def _scenario(rank, shapes):
    import torch
    import torch.distributed as dist

    import detlogp.torch as dt

    world = dist.group.WORLD
    inputs = _inputs(rank, shapes)

    def score(name):
        logits, ids = inputs[name]
        with torch.no_grad():
            return dt.vocab_parallel_logprobs(logits, ids, group=world, real_vocab=REAL)

    expected = {name: score(name) for name in shapes}  # one after another: the reference
    outcomes = {name: [] for name in shapes}
    start = threading.Barrier(len(shapes))

    def thread(name):
        for _ in range(ROUNDS):
            start.wait()
            try:
                outcomes[name].append(("ok", score(name)))
            except Exception as e:  # noqa: BLE001 - recorded for the parent's assertion
                outcomes[name].append(("error", f"{type(e).__name__}: {e}"))

    threads = [threading.Thread(target=thread, args=(name,)) for name in shapes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dist.barrier()
    after = {name: score(name) for name in shapes}  # the group still works, in order
    return {"expected": expected, "outcomes": outcomes, "after": after}


def main(rank, world, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    from spawn import gloo_rank

    def body():
        # Different shapes: interleaved gathers of different sizes (gloo aborted on those).
        # The same shapes and targets, different logits: a mix-up would pass every check.
        return {"different shapes": _scenario(rank, {"policy": (2, 9), "reference": (3, 5)}),
                "same shapes": _scenario(rank, {"policy": (2, 9), "reference": (2, 9)})}

    gloo_rank(rank, world, init_file, out_dir, body)
