"""One rank of the transport-failure tests (test_transport_failures.py):
rank 1 leaves rank 0 alone in its call, either by exiting at once after joining the process
group (``peer="exits"``: its connections close) or by never calling forward
(``peer="sleeps"``); rank 0 calls forward over a TorchDistributedComm with ``timeout`` seconds
and records what it raised, and after how long."""

import datetime
import os
import sys
import time


def main(rank, init_file, out_dir, tests_dir, peer, timeout):
    sys.path.insert(0, tests_dir)
    import torch
    import torch.distributed as dist

    import detlogp
    from helpers import contract

    torch.set_num_threads(1)
    message = "no error"
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=2, timeout=datetime.timedelta(seconds=60))
        if rank == 1 and peer == "exits":
            os._exit(0)  # gone before forward: its connections close
        if rank == 1:
            time.sleep(8)  # never calls forward
        else:
            bounds = [(0, 512), (512, 1024)]
            c = contract(4, 1000, 1024, bounds=bounds, rank=0)
            op, _ = detlogp.get_logprob_op(c)
            x = torch.randn(4, 1024)[:, 0:512].contiguous()
            t = torch.tensor([1, 2, 3, 4])
            comm = detlogp.TorchDistributedComm(timeout=timeout)
            start = time.monotonic()
            try:
                op.forward(x.numpy(), t.numpy(), contract=c, group=comm)
            except RuntimeError as e:
                message = f"RuntimeError after {time.monotonic() - start:.1f} s: {e}"
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        message = f"crash: {type(e).__name__}: {e}"
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(message)
    # A pending gloo collective would keep destroy_process_group waiting: leave at once.
    os._exit(0)
