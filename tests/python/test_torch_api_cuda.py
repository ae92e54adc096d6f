"""detlogp.torch with CUDA logits: outputs and gradients bitwise equal to the CPU run, the
gradient on the logits' device; an NCCL group of one rank takes the device transport. Needs a
CUDA build, a CUDA torch and a device: skipped elsewhere (CI here has none)."""

import datetime
import os
import tempfile

import pytest
import torch

import detlogp
import detlogp.torch as dt
from helpers import assert_bitwise

gpu = pytest.mark.skipif(
    not (detlogp.CUDA_BUILT and torch.cuda.is_available() and detlogp.cuda_status()[1] > 0),
    reason="needs a CUDA build of detlogp, a CUDA torch and a device")


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 9, 1024, generator=g) * 3).bfloat16()
    ids = torch.randint(0, 1000, (2, 9), generator=g)
    mask = (torch.rand(2, 9, generator=g) > 0.2).float()
    return x, ids, mask


def _run(x, ids, mask, group=None):
    leaf = x.clone().requires_grad_()
    logp, ent = dt.vocab_parallel_logprobs(leaf[:, :-1], ids[:, 1:], loss_mask=mask[:, 1:],
                                           real_vocab=1000, entropy=True, group=group)
    (logp.sum() + ent.sum()).backward()
    return logp.detach(), ent.detach(), leaf.grad


@gpu
def test_cuda_logits_equal_cpu():
    x, ids, mask = _inputs()
    cpu = _run(x, ids, mask)
    cuda = _run(x.cuda(), ids.cuda(), mask.cuda())
    assert cuda[0].device.type == "cuda" and cuda[2].device == x.cuda().device
    for a, b, what in zip(cuda, cpu, ("logp", "entropy", "grad")):
        assert_bitwise(a.cpu(), b, what)


@gpu
def test_nccl_group_of_one_takes_the_device_path():
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl", init_method=f"file://{os.path.join(tmp, 'r')}", rank=0,
                                world_size=1, timeout=datetime.timedelta(seconds=60))
        try:
            comm = detlogp.TorchDistributedComm(dist.group.WORLD)
            assert comm.name == "torch.distributed:nccl"
            assert comm.all_gather(b"\x01\x02") == b"\x01\x02"
            x, ids, mask = _inputs()
            got = _run(x.cuda(), ids.cuda(), mask.cuda(), group=dist.group.WORLD)
            ref = _run(x, ids, mask)
            for a, b, what in zip(got, ref, ("logp", "entropy", "grad")):
                assert_bitwise(a.cpu(), b, what)
        finally:
            dist.destroy_process_group()
