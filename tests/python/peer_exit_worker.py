"""One rank of test_transport_failures.py: rank 1 joins the process group and exits at once;
rank 0 calls forward over a TorchDistributedComm with a long timeout and records what it
raised (the peer is gone: the transport says so at once, long before the timeout)."""

import datetime
import os
import sys


def main(rank, init_file, out_dir, tests_dir):
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
        if rank == 1:
            os._exit(0)  # gone before forward: its connections close
        bounds = [(0, 512), (512, 1024)]
        c = contract(4, 1000, 1024, bounds=bounds, rank=0)
        op, _ = detlogp.get_logprob_op(c)
        x = torch.randn(4, 1024)[:, 0:512].contiguous()
        t = torch.tensor([1, 2, 3, 4])
        comm = detlogp.TorchDistributedComm(timeout=300)
        try:
            op.forward(x.numpy(), t.numpy(), contract=c, group=comm)
        except RuntimeError as e:
            message = f"RuntimeError: {e}"
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        message = f"crash: {type(e).__name__}: {e}"
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(message)
    os._exit(0)
