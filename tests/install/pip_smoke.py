"""Run by the pip tests with an installed venv's python, from a directory outside the source
tree: the package imports from that venv's site-packages (argv[1]), and a TP=1 forward and
backward on NumPy arrays (no torch needed) match float64 NumPy on the same logits."""

import os
import sys

import numpy as np

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
rng = np.random.default_rng(3)
x = (rng.standard_normal((n, padded)) * 3).astype(np.float32)
t = rng.integers(0, real, n)
fwd = op.forward(x, t, contract=contract)
grad = fwd.backward(grad_logp=np.ones(n, dtype=np.float32))

z = x.astype(np.float64)[:, :real]
m = z.max(axis=1)
ref_lse = m + np.log(np.exp(z - m[:, None]).sum(axis=1))
ref_logp = z[np.arange(n), t] - ref_lse
ref_grad = -np.exp(z - ref_lse[:, None])
ref_grad[np.arange(n), t] += 1.0
assert np.abs(fwd.lse - ref_lse).max() <= 1e-5
assert np.abs(fwd.logp - ref_logp).max() <= 1e-5
assert np.abs(grad[:, :real] - ref_grad).max() <= 1e-5
assert not grad[:, real:].any(), "padding gradient not 0"
print(f"detlogp {detlogp.__version__} from {os.path.dirname(where)}: TP=1 forward+backward ok")
