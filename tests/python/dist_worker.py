"""One rank of the torch.distributed (gloo) tests in test_distributed.py.

Runs in a spawned process: joins a world of `world` ranks over a file:// rendezvous, runs
every scenario in the same order on every rank, and writes what it saw to
<out>/rank<r>.pt. An expected failure is recorded as its message; the parent asserts.
"""

import sys


def _scenarios(rank, world, data):
    import torch
    import torch.distributed as dist

    import detlogp
    from helpers import contract

    x, t, mask, weights = data["x"], data["t"], data["mask"], data["weights"]
    n, real, padded, w = len(t), data["real"], data["padded"], data["tile_width"]
    out = {}

    def run(group, bounds, r, dtype, name, entropy=True, use_numpy=False):
        c = contract(n, real, padded, bounds=bounds, rank=r, mask=mask, dtype=dtype,
                     tile_width=w)
        op, prov = detlogp.get_logprob_op(c)
        s, e = bounds[r]
        full = x.to({"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])
        shard = full[:, s:e]  # a strided view of the full logits: no copy anywhere
        if use_numpy:
            f = op.forward(shard.numpy(), t.numpy(), contract=c, group=group, entropy=entropy)
            out[name] = {"logp": torch.from_numpy(f.logp), "lse": torch.from_numpy(f.lse),
                         "entropy": torch.from_numpy(f.entropy)}
            return
        leaf = shard.detach().clone().requires_grad_()
        outs = op(leaf, t, contract=c, group=group, entropy=entropy)
        loss = sum((wi * o).sum() for wi, o in zip(weights, outs))
        loss.backward()
        res = {"logp": outs[0].detach(), "lse": outs[1].detach(), "grad": leaf.grad,
               "fingerprint": c.cross_rank_fingerprint(), "backend": prov["actual_backend"]}
        if entropy:
            res["entropy"] = outs[2].detach()
        out[name] = res

    def expect_failure(name, fn):
        try:
            fn()
        except detlogp.LogprobContractError as e:
            out[name] = "LogprobContractError: " + str(e)
        except Exception as e:  # noqa: BLE001 - recorded for the parent's assertion
            out[name] = f"{type(e).__name__}: {e}"
        else:
            out[name] = "no error"

    world_group = dist.group.WORLD
    if world == 4:
        uneven = [(0, 192), (192, 512), (512, 896), (896, 1024)]
        run(world_group, uneven, rank, "fp32", "tp4_fp32")
        run(world_group, uneven, rank, "bf16", "tp4_bf16")
        run(world_group, uneven, rank, "fp32", "tp4_numpy", use_numpy=True)
        # Two TP groups of 2 inside the world of 4 (every rank creates every group).
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        tp2 = [(0, 512), (512, 1024)]
        run(groups[rank // 2], tp2, rank % 2, "bf16", "tp2_bf16")
        run(groups[rank // 2], tp2, rank % 2, "fp32", "tp2_fp32")

        even = [(0, 256), (256, 512), (512, 768), (768, 1024)]

        def tile_mismatch(validate):
            def fn():
                c = contract(n, real, padded, bounds=even, rank=rank, mask=mask,
                             tile_width=128 if rank == 3 else 64)
                op, _ = detlogp.get_logprob_op(c)
                s, e = even[rank]
                op(x[:, s:e], t, contract=c, group=world_group, validate=validate)
            return fn

        expect_failure("mismatch_tile_width", tile_mismatch(True))
        expect_failure("mismatch_tile_width_validate_off", tile_mismatch(False))

        def local_error():  # only rank 1 has a bad target: every rank must raise
            c = contract(n, real, padded, bounds=even, rank=rank, mask=mask, tile_width=64)
            op, _ = detlogp.get_logprob_op(c)
            tt = t.clone()
            if rank == 1:
                tt[1] = real + 3  # row 1 is active
            s, e = even[rank]
            op(x[:, s:e], tt, contract=c, group=world_group)

        expect_failure("local_error_one_rank", local_error)

        def python_check_one_rank():  # only rank 1 passes fp64 logits, rejected in Python
            c = contract(n, real, padded, bounds=even, rank=rank, mask=mask, tile_width=64)
            op, _ = detlogp.get_logprob_op(c)
            s, e = even[rank]
            local = x[:, s:e]
            op(local.double() if rank == 1 else local, t, contract=c, group=world_group)

        expect_failure("python_check_one_rank", python_check_one_rank)

        def mixed_mode():  # rank 0 non-deterministic, the others deterministic
            c = contract(n, real, padded, bounds=even, rank=rank, mask=mask, tile_width=64,
                         scope="fixed_topology")
            op, _ = detlogp.get_logprob_op(c)
            s, e = even[rank]
            op(x[:, s:e], t, contract=c, group=world_group, deterministic=rank != 0)

        expect_failure("mixed_deterministic", mixed_mode)

        def wrong_group_size():  # a TP=2 contract with the world group of 4
            c = contract(n, real, padded, bounds=tp2, rank=rank % 2, mask=mask, tile_width=64)
            op, _ = detlogp.get_logprob_op(c)
            s, e = tp2[rank % 2]
            op(x[:, s:e], t, contract=c, group=world_group)

        expect_failure("wrong_group_size", wrong_group_size)
        # The group still works after every failure above.
        run(world_group, uneven, rank, "fp32", "tp4_after_failures", entropy=False)
        comm = detlogp.TorchDistributedComm(world_group)
        out["comm"] = (comm.rank, comm.size, comm.name,
                       comm.all_gather(bytes([rank, 10 + rank])), comm.all_gather(b""))
        comm.barrier()
    return out


def main(rank, world, init_file, data_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    import torch

    from spawn import gloo_rank

    gloo_rank(rank, world, init_file, out_dir,
              lambda: _scenarios(rank, world, torch.load(data_file, weights_only=False)))
