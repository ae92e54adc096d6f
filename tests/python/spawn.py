"""Spawned rank processes for the distributed Python tests: one way to start them, to catch a
hang and to read each rank's result file."""

import os
import pathlib

import torch
import torch.multiprocessing as mp


def spawn_ranks(main, args_for, world, tmp, timeout_s, *, results=True):
    """Runs main(*args_for(rank)) for every rank of `world` in spawned processes (one OpenMP
    thread each, so that the ranks share two cores without oversubscription); a rank still
    running after timeout_s is killed and fails the test as a hang. Returns each rank's result
    dict, read from tmp/rank<r>.pt (checked for a recorded crash), and the exit codes; with
    results=False (workers that write their own files) the results are None."""
    ctx = mp.get_context("spawn")
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        procs = [ctx.Process(target=main, args=args_for(r)) for r in range(world)]
        for p in procs:
            p.start()
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    for p in procs:
        p.join(timeout_s)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    assert not hung, f"ranks {hung} did not finish within {timeout_s} s (hang)"
    codes = [p.exitcode for p in procs]
    if not results:
        return None, codes
    out = []
    for r in range(world):
        f = tmp / f"rank{r}.pt"
        assert f.exists(), f"rank {r} exited with {codes[r]} and wrote no result"
        res = torch.load(f, weights_only=False)  # written by our own ranks: not only tensors
        assert "crash" not in res, f"rank {r} crashed:\n{res['crash']}"
        out.append(res)
    return out, codes


def run_workers(main, tmp, world, timeout_s, *extra, pass_world=True, results=True):
    """``spawn_ranks`` for a test worker whose ``main`` takes (rank, [world,] rendezvous file,
    out dir, tests dir, *extra): its ranks meet through ``tmp/rendezvous`` and write their
    results to ``tmp``."""
    tests_dir = str(pathlib.Path(__file__).parent)

    def args_for(rank):
        head = (rank, world) if pass_world else (rank,)
        return head + (str(tmp / "rendezvous"), str(tmp), tests_dir) + extra

    return spawn_ranks(main, args_for, world, tmp, timeout_s, results=results)


def gloo_rank(rank, world, init_file, out_dir, body, *, teardown=True):
    """The life of one spawned rank: one torch thread, a gloo world over the file:// rendezvous,
    result = body(), then a barrier and the group's teardown (teardown=False where a scenario
    left a collective that a peer never joined); an exception is recorded as "crash" for the
    parent; the result goes to out_dir/rank<rank>.pt."""
    import datetime
    import traceback

    import torch.distributed as dist

    torch.set_num_threads(1)
    result = {}
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=60))
        result = body()
        if teardown:
            dist.barrier()
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        result["crash"] = traceback.format_exc()
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


def record_failure(out, name, fn):
    """Runs fn() on a spawned rank and records in out[name] what it raised ("no error" if
    nothing) and how long it took, for the parent's assertions."""
    import time

    import detlogp

    t0 = time.monotonic()
    try:
        fn()
    except detlogp.LogprobContractError as e:
        msg = "LogprobContractError: " + str(e)
    except Exception as e:  # noqa: BLE001 - recorded for the parent's assertion
        msg = f"{type(e).__name__}: {e}"
    else:
        msg = "no error"
    out[name] = {"message": msg, "seconds": time.monotonic() - t0}
