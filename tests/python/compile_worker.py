"""A GRPO-style loss (logp + entropy + masked mean + backward) eager and under
torch.compile(fullgraph=True, dynamic=True), for test_compile.py: in the test's own process at
TP=1, and on each spawned rank of a gloo world of 2 at TP=2 (and at TP=1 with
detlogp.SelfComm(), every rank holding the whole vocabulary).

``grpo_eager_and_compiled`` returns, for each of three token counts, the outputs, the loss and
the logits' gradient of both runs (the parent compares them), the graph breaks that
``torch._dynamo.explain`` counts and what a recompile raised (None: none happened; the
compiled function runs with ``error_on_recompile``).
"""

import sys

B, REAL, V = 2, 250, 256
TOKEN_COUNTS = (7, 12, 19)  # sequence lengths; the loss scores positions 1..S-1
# (backend, loss): aot_eager runs the compiled graph with torch's own kernels; inductor
# generates its own code for the loss around the op.
# "grpo softcap": the GRPO loss on softcapped logits (the cap crosses the op as an argument).
CASES = (("aot_eager", "grpo"), ("inductor", "grpo"), ("inductor", "linear"),
         ("aot_eager", "grpo softcap"))
SOFTCAP = 3.0  # the logits are ~N(0, 2): the cap bends most of them


def _data(seq, tp, tp_rank):
    """[B, seq, V/tp] logits (this rank's columns of one full tensor), ids, a float response
    mask (verl's), the rollout's logp and the advantages: the same on every rank."""
    import torch

    g = torch.Generator().manual_seed(seq)
    full = torch.randn(B, seq, V, generator=g) * 2
    ids = torch.randint(0, REAL, (B, seq), generator=g)
    ids[1, 2] = -100
    mask = torch.ones(B, seq)
    mask[0, :3] = 0  # the prompt of sequence 0
    old_logp = -torch.rand(B, seq - 1, generator=g) * 6
    adv = torch.randn(B, 1, generator=g)
    w = V // tp
    return full[..., tp_rank * w:(tp_rank + 1) * w].contiguous(), ids, mask, old_logp, adv


def _loss_fn(group, kind):
    """``kind`` "grpo": the clipped ratio objective with an entropy bonus and a masked mean
    ("grpo softcap": the same with ``softcap=SOFTCAP``); "linear": fixed weights times logp and
    entropy, summed, whose backward hands the op exactly the weights as incoming gradients
    under any backend."""
    import detlogp.torch as dt
    import torch

    def grpo_loss(logits, ids, mask, old_logp, adv):
        # The causal shift: position t scores token t+1 (a view, read in place).
        logp, entropy = dt.vocab_parallel_logprobs(
            logits[:, :-1], ids[:, 1:], group=group, real_vocab=REAL,
            loss_mask=mask[:, 1:], entropy=True,
            softcap=SOFTCAP if kind == "grpo softcap" else None)
        if kind == "linear":
            return (logp * old_logp).sum() + (entropy * adv).sum(), logp, entropy
        ratio = torch.exp(logp - old_logp)
        clipped = torch.clamp(ratio, 0.8, 1.2)
        per_token = -torch.minimum(ratio * adv, clipped * adv) - 0.01 * entropy
        m = mask[:, 1:]
        loss = (per_token * m).sum() / m.sum()
        return loss, logp, entropy

    return grpo_loss


def _run(fn, logits, rest):
    leaf = logits.clone().requires_grad_()
    loss, logp, entropy = fn(leaf, *rest)
    loss.backward()
    return {"loss": loss.detach(), "logp": logp.detach(), "entropy": entropy.detach(),
            "grad": leaf.grad}


def grpo_eager_and_compiled(group, tp, tp_rank, backend, kind="grpo"):
    import torch

    torch._dynamo.reset()
    fn = _loss_fn(group, kind)
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=backend)
    steps, recompile = [], None
    for i, seq in enumerate(TOKEN_COUNTS):
        logits, *rest = _data(seq, tp, tp_rank)
        eager = _run(fn, logits, rest)
        try:
            with torch._dynamo.config.patch(error_on_recompile=i > 0):
                comp = _run(compiled, logits, rest)
        except Exception as e:  # noqa: BLE001 - recorded for the parent's assertion
            recompile = f"{type(e).__name__}: {e}"
            break
        steps.append({"seq": seq, "eager": eager, "compiled": comp,
                      "unscored": rest[1][:, 1:] == 0})
    logits, *rest = _data(TOKEN_COUNTS[0], tp, tp_rank)
    explained = torch._dynamo.explain(fn)(logits.clone().requires_grad_(), *rest)
    torch._dynamo.reset()
    return {"steps": steps, "recompile": recompile,
            "graph_breaks": explained.graph_break_count, "graphs": explained.graph_count}


def _scenarios(rank):
    import torch.distributed as dist

    import detlogp

    return {(tp, backend, kind): grpo_eager_and_compiled(group, tp, tp_rank, backend, kind)
            for tp, group, tp_rank in ((2, dist.group.WORLD, rank), (1, detlogp.SelfComm(), 0))
            for backend, kind in CASES}


def main(rank, world, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    from spawn import gloo_rank

    gloo_rank(rank, world, init_file, out_dir, lambda: _scenarios(rank))
