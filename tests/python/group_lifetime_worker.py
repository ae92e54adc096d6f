"""One rank of test_group_lifetime.py: scores on the world group through detlogp (the op's
per-group communicator cache and a communicator of the caller's), destroys the group, and
records whether reference counting alone freed it (the garbage collector is off) and what a
later call on the kept communicator raises."""

import datetime
import gc
import os
import weakref


def main(rank, world, init_file, out_dir, tests_dir):
    import torch
    import torch.distributed as dist

    import detlogp
    import detlogp.torch as dt

    torch.set_num_threads(1)
    gc.disable()  # only reference counting may free the group
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    g = torch.Generator().manual_seed(5)
    full = torch.randn(4, 2 * 128, generator=g)
    ids = torch.randint(0, 250, (4,), generator=g)
    logits = full[:, rank * 128:(rank + 1) * 128]
    kept = detlogp.TorchDistributedComm(dist.group.WORLD)
    with torch.no_grad():
        for group in (dist.group.WORLD, kept):
            dt.vocab_parallel_logprobs(logits, ids, group=group, real_vocab=250)
    ref = weakref.ref(dist.group.WORLD)
    dist.barrier()
    dist.destroy_process_group()
    result = {"alive_after_destroy": ref() is not None}
    try:
        with torch.no_grad():
            dt.vocab_parallel_logprobs(logits, ids, group=kept, real_vocab=250)
        result["later_call"] = "no error"
    except Exception as e:  # noqa: BLE001 - recorded for the parent's assertion
        result["later_call"] = f"{type(e).__name__}: {e}"
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
