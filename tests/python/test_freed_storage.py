"""Backward re-reads what forward read: the logits (the op and detlogp.torch), the fused lm_head's
hidden states and weight. Freeing their storage between forward and backward the way FSDP and
offloading do (``storage().resize_(0)``, which autograd's version counter does not see) must
raise LogprobContractError naming the buffer, never read freed memory. Each case runs in a
child process, so a crash fails the case instead of the test run."""

import textwrap

import pytest

pytest.importorskip("torch")

from helpers import run_child_script  # noqa: E402 - it imports torch

PRELUDE = """
import torch, detlogp
import detlogp.torch as dt

def free(t):
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    s.resize_(0)

def fused():  # hidden, weight and the logp of a fused lm_head forward with autograd
    h = torch.randn(64, 256, requires_grad=True)
    w = torch.randn(4096, 256, requires_grad=True)
    logp, lse = detlogp.fused_linear_logprobs(h, w, torch.randint(0, 4096, (64,)))
    return h, w, logp

torch.manual_seed(0)
"""

CASES = {
    "torch API logits": ("the logits", """
        x = torch.randn(64, 4096, requires_grad=True)
        logp = dt.vocab_parallel_logprobs(x, torch.randint(0, 4096, (64,)))
        free(x)
        logp.sum().backward()
    """),
    "torch API logits, shifted view": ("the logits", """
        x = torch.randn(2, 33, 4096, requires_grad=True)
        y = x * 1.0
        logp = dt.vocab_parallel_logprobs(y[:, :-1], torch.randint(0, 4096, (2, 32)))
        free(y)
        logp.sum().backward()
    """),
    "op logits": ("the logits", """
        c = detlogp.LogprobContract(
            role="train", dtype="fp32", mask=detlogp.MaskSpec(64, [True] * 64),
            sharding=detlogp.ShardingSpec(tp_rank=0, tp_world_size=1,
                                          vocab_shard_bounds=[(0, 4096)],
                                          real_vocab_size=4096, padded_vocab_size=4096))
        x = torch.randn(64, 4096, requires_grad=True)
        op = detlogp.get_logprob_op(c).op
        logp, lse = op(x, torch.randint(0, 4096, (64,)), contract=c)
        free(x)
        (logp.sum() + lse.sum()).backward()
    """),
    "fused weight": ("weight", """
        h, w, logp = fused()
        free(w)
        logp.sum().backward()
    """),
    "fused hidden": ("hidden", """
        h, w, logp = fused()
        free(h)
        logp.sum().backward()
    """),
    "fused weight reallocated elsewhere": ("weight", """
        h, w, logp = fused()
        keep = torch.empty(4096 * 256)  # the old block stays taken: the new one lies elsewhere
        s = w.untyped_storage() if hasattr(w, "untyped_storage") else w.storage()
        n = s.size()
        s.resize_(0)
        keep2 = torch.empty(4096 * 256)
        s.resize_(n)
        logp.sum().backward()
    """),
}

CHECK = """
try:
{body}
except detlogp.LogprobContractError as e:
    print("RAISED", e)
else:
    print("NO ERROR")
"""


@pytest.mark.parametrize("case", list(CASES))
def test_freed_storage_before_backward_raises(case):
    name, body = CASES[case]
    script = PRELUDE + CHECK.format(body=textwrap.indent(textwrap.dedent(body), "    "))
    proc = run_child_script(script)
    assert proc.returncode == 0, f"child exited with {proc.returncode}:\n{proc.stderr}"
    out = proc.stdout.strip()
    assert out.startswith("RAISED"), out
    assert f"the storage of {name} was freed or moved after forward" in out, out
    assert f"keep {name} allocated" in out, out


def test_storage_intact_backward_still_runs():
    script = PRELUDE + textwrap.dedent("""
        x = torch.randn(8, 64, requires_grad=True)
        dt.vocab_parallel_logprobs(x, torch.randint(0, 64, (8,))).sum().backward()
        h = torch.randn(8, 16, requires_grad=True)
        w = torch.randn(64, 16, requires_grad=True)
        detlogp.fused_linear_logprobs(h, w, torch.randint(0, 64, (8,)))[0].sum().backward()
        print(bool(torch.isfinite(x.grad).all() and torch.isfinite(w.grad).all()))
    """)
    proc = run_child_script(script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"
