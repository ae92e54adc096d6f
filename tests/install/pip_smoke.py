"""Run by pip_install_test.sh with the venv's python, from a directory outside the source tree:
the installed package imports from the venv, and a TP=1 forward and backward through
torch.autograd match float64 torch on the same logits."""

import os
import sys

import torch

import detlogp

site = os.path.realpath(sys.argv[1])
where = os.path.realpath(detlogp.__file__)
assert where.startswith(site + os.sep), f"detlogp imported from {where}, not from {site}"

n, real, padded = 5, 1000, 1024
contract = detlogp.LogprobContract(
    role="train", dtype="fp32",
    mask=detlogp.MaskSpec(num_tokens=n, active_mask=[True] * n),
    sharding=detlogp.ShardingSpec(tp_rank=0, tp_world_size=1, vocab_shard_bounds=[(0, padded)],
                                  real_vocab_size=real, padded_vocab_size=padded),
    tile_width=64)
op, _ = detlogp.get_logprob_op(contract)
g = torch.Generator().manual_seed(3)
x = (torch.randn(n, padded, generator=g) * 3).requires_grad_()
t = torch.randint(0, real, (n,), generator=g)
logp, lse = op(x, t, contract=contract)
logp.sum().backward()

z = x.detach().double()[:, :real]
ref_lse = torch.logsumexp(z, -1)
ref_logp = z.gather(1, t[:, None])[:, 0] - ref_lse
ref_grad = -torch.softmax(z, -1)
ref_grad[torch.arange(n), t] += 1.0
assert (lse.double() - ref_lse).abs().max() <= 1e-5
assert (logp.double() - ref_logp).abs().max() <= 1e-5
assert (x.grad[:, :real].double() - ref_grad).abs().max() <= 1e-5
assert torch.equal(x.grad[:, real:], torch.zeros(n, padded - real)), "padding gradient not 0"
print(f"detlogp {detlogp.__version__} from {os.path.dirname(where)}: TP=1 forward+backward ok")
