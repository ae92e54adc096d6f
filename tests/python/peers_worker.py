"""One rank of test_peers.py: detlogp's drop-ins and the real Megatron and verl functions they
replace (tests/python/peers.py loads them), on the same logits, over gloo in a world of 4.

Every rank initializes Megatron's parallel state at TP = 1, 2 and 4 in turn (the real
functions take their group from it, and so do detlogp's drop-ins called without ``group=``)
and writes to <out>/rank<r>.pt, for each TP degree and dtype, from each real function and
from its detlogp replacement: the outputs and what the test needs of the gradient of its
logits shard (``_at_tp``); at TP = 1 also verl's one-rank ``logprobs_from_logits`` and
``entropy_from_logits`` and theirs.
"""

import sys

B, S, V = 4, 32, 32768  # 128 tokens; a vocabulary of 32k columns, every column real
DTYPES = ("float32", "bfloat16")
TPS = (1, 2, 4)


def data(dtype):
    """The same logits [B, S, V], targets and output weights on every rank."""
    import torch

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(B, S, V, generator=g) * 3).to(getattr(torch, dtype))
    ids = torch.randint(0, V, (B, S), generator=g)
    weights = torch.randn(B, S, generator=g)  # d(loss)/d(output): a backward that is not all 1
    return logits, ids, weights


def _run(fn, shard, weights):
    """fn(leaf) on a fresh copy of the shard (the real Megatron function writes into fp32
    logits), its backward with ``weights``: (output, gradient of the shard, whether the
    logits were written into, bitwise)."""
    import torch

    leaf = shard.clone().requires_grad_()
    out = fn(leaf)
    (out * weights).sum().backward()
    return out.detach().clone(), leaf.grad.clone(), not torch.equal(_bits(leaf), _bits(shard))


def _pairs(real, tp_group):
    """(name, the real function, detlogp's) on this rank's shard: the real ones take Megatron's
    TP group from its parallel state, and so do detlogp's drop-ins (without ``group=``); the
    ``tp_group`` case passes the group by Megatron's name, positionally, to both."""
    import detlogp.torch as dt

    mtp, vtp = real.tensor_parallel, real.verl_tensor_parallel
    return [
        ("vocab_parallel_cross_entropy", mtp.vocab_parallel_cross_entropy,
         dt.vocab_parallel_cross_entropy),
        ("vocab_parallel_cross_entropy tp_group",
         lambda x, t: mtp.vocab_parallel_cross_entropy(x, t, 0.0, tp_group),
         lambda x, t: dt.vocab_parallel_cross_entropy(x, t, 0.0, tp_group)),
        ("vocab_parallel_log_probs_from_logits", vtp.vocab_parallel_log_probs_from_logits,
         dt.vocab_parallel_log_probs_from_logits),
        ("vocab_parallel_entropy", lambda x, t: vtp.vocab_parallel_entropy(x),
         lambda x, t: dt.vocab_parallel_entropy(x)),
    ]


def _one_rank_pairs(real):
    import detlogp.torch as dt

    tf = real.torch_functional
    return [("logprobs_from_logits", tf.logprobs_from_logits, dt.logprobs_from_logits),
            ("entropy_from_logits", lambda x, t: tf.entropy_from_logits(x),
             lambda x, t: dt.entropy_from_logits(x))]


def _bits(t):
    """The raw bits of a float tensor (an integer view: -0.0 != +0.0, NaN == NaN)."""
    import torch

    return t.detach().view({torch.float32: torch.int32, torch.bfloat16: torch.int16}[t.dtype])


def _same_bits(a, b):
    """Per token (all dims but the last), whether the rows of a and b are bitwise equal."""
    return (_bits(a) == _bits(b)).all(dim=-1)


def _at_tp(real, tp, tp1_grads):
    """Every pair at this TP degree. The gradients stay here (they are as large as the logits):
    what is written is each output, the largest gradient difference between detlogp and the
    real function, and, per token, whether the gradient row equals the TP=1 one on these
    columns (kept in ``tp1_grads`` at TP = 1)."""
    import torch

    ps = real.parallel_state
    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    try:
        group, tp_rank = ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_rank()
        assert ps.get_tensor_model_parallel_world_size() == tp
        w = V // tp
        columns = slice(tp_rank * w, (tp_rank + 1) * w)
        out = {}
        for dtype in DTYPES:
            logits, ids, weights = data(dtype)
            shard = logits[..., columns]
            pairs = _pairs(real, group) + (_one_rank_pairs(real) if tp == 1 else [])
            for name, real_fn, ours_fn in pairs:
                grads = {}
                for who, fn in (("real", real_fn), ("detlogp", ours_fn)):
                    key = f"{name} {who} {dtype}"
                    value, grads[who], wrote = _run(lambda x: fn(x, ids), shard, weights)
                    if tp == 1:
                        tp1_grads[key] = grads[who]
                    out[f"{key} tp{tp}"] = {
                        "value": value, "grad dtype": grads[who].dtype,
                        "wrote into the logits": wrote,
                        "grad rows as at tp1": _same_bits(grads[who],
                                                          tp1_grads[key][..., columns])}
                out[f"{name} detlogp {dtype} tp{tp}"]["grad max diff"] = (
                    (grads["detlogp"].double() - grads["real"].double()).abs().max().item())
            torch.distributed.barrier()
        return out
    finally:
        ps.destroy_model_parallel()


def _signatures(real):
    """{name: (the real function's parameters, detlogp's)}, each as (name, kind, default)."""
    import inspect

    import detlogp.torch as dt

    def params(fn):
        return [(p.name, p.kind.name, repr(p.default))
                for p in inspect.signature(fn).parameters.values()]

    real_fns = {"vocab_parallel_cross_entropy": real.tensor_parallel.vocab_parallel_cross_entropy,
                "logprobs_from_logits": real.torch_functional.logprobs_from_logits,
                "entropy_from_logits": real.torch_functional.entropy_from_logits}
    for name in ("vocab_parallel_log_probs_from_logits", "vocab_parallel_entropy"):
        real_fns[name] = getattr(real.verl_tensor_parallel, name)
    return {name: (params(fn), params(getattr(dt, name))) for name, fn in real_fns.items()}


def _body():
    import warnings

    import torch

    import peers

    # Megatron says, at import, that Transformer Engine, Apex and absl are not installed.
    warnings.filterwarnings("ignore", category=UserWarning, module="megatron")

    # verl's vocab_parallel_entropy wraps one product-sum in torch.compile, which on CPU
    # compiles C++ for a minute per rank; the test runs it eagerly (the same expression).
    torch._dynamo.config.disable = True
    real = peers.load()
    out, tp1_grads = {"signatures": _signatures(real)}, {}
    for tp in TPS:
        out.update(_at_tp(real, tp, tp1_grads))
    return out


def main(rank, world, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    from spawn import gloo_rank

    gloo_rank(rank, world, init_file, out_dir, _body)
