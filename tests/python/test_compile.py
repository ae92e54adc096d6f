"""detlogp under torch.compile: a GRPO-style loss (logp + entropy + masked mean + backward)
compiled with fullgraph=True and dynamic=True has no graph break and compiles once for three
token counts; logp and entropy are eager's bit for bit, and so are the loss and the logits'
gradient wherever the rest of the compiled graph is (``_check``), with and without ``softcap=``.
At TP=1 in this process and at TP=2 (and TP=1 with SelfComm) on two gloo ranks, whose
collectives run inside the op."""

import pytest

torch = pytest.importorskip("torch")

import compile_worker  # noqa: E402
from helpers import assert_bitwise  # noqa: E402
from spawn import run_workers  # noqa: E402

TIMEOUT_S = 600


def _check(result, where, backend, kind):
    """No graph break, one compilation for the three token counts, and eager's bits: logp and
    entropy always; the loss and the gradient where the compiled loss itself is eager's bit for
    bit. The aot_eager backend runs the graph with torch's own kernels: everything is eager's.
    Inductor generates its own code for the loss around the op (its masked mean sums in an
    order of its own, and its backward may scale by a reciprocal): its loss and the gradients
    it sends into the op may differ from eager's in the last bits, so there the GRPO loss and
    gradient are only close. With the "linear" loss, whose backward sends the op exactly the
    loss's weights, the gradient is eager's bit for bit under inductor too."""
    assert result["recompile"] is None, f"{where}: {result['recompile']}"
    assert result["graph_breaks"] == 0 and result["graphs"] == 1, (where, result)
    assert [s["seq"] for s in result["steps"]] == list(compile_worker.TOKEN_COUNTS)
    exact_loss = backend == "aot_eager"
    exact_grad = backend == "aot_eager" or kind == "linear"
    for step in result["steps"]:
        what = f"{where}, {step['seq']} positions"
        eager, compiled = step["eager"], step["compiled"]
        for name in ("logp", "entropy") + (("loss",) if exact_loss else ()):
            assert_bitwise(eager[name], compiled[name], f"{what}: {name}")
        if kind == "linear":
            assert_bitwise(eager["grad"], compiled["grad"], f"{what}: gradient")
        elif exact_grad:
            _check_grad(eager["grad"], compiled["grad"], step["unscored"], what)
        for name in ("loss", "grad"):
            torch.testing.assert_close(compiled[name], eager[name], rtol=1e-5, atol=1e-7,
                                       msg=f"{what}: {name}")


def _check_grad(eager, compiled, unscored, what):
    """The logits' gradient of the GRPO loss, bit for bit, except the sign of a zero on the rows
    of unscored tokens: their gradient is a zero whose sign follows the sign of the zero
    gradient that the loss sends them (docs/numerics.md, "Backward"), and the compiled backward
    of the loss (torch's, not detlogp's) may send +0 where eager sends -0."""
    assert_bitwise(eager[:, -1], compiled[:, -1], f"{what}: gradient of the last position")
    e, c = eager[:, :-1], compiled[:, :-1]
    assert_bitwise(e[~unscored], c[~unscored], f"{what}: gradient of the scored tokens")
    assert not e[unscored].any() and not c[unscored].any(), what
    assert_bitwise(e[unscored] + 0.0, c[unscored] + 0.0, f"{what}: unscored tokens")


@pytest.mark.parametrize("backend,kind", compile_worker.CASES)
def test_compiled_grpo_loss_equals_eager_at_tp1(backend, kind):
    _check(compile_worker.grpo_eager_and_compiled(None, 1, 0, backend, kind),
           f"TP=1 {backend} {kind}", backend, kind)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_workers(compile_worker.main, tmp_path_factory.mktemp("compile"), 2, TIMEOUT_S)[0]


def test_compiled_grpo_loss_equals_eager_at_tp2_over_gloo(ranks):
    for r, res in enumerate(ranks):
        for (tp, backend, kind), result in res.items():
            _check(result, f"TP={tp} rank {r} {backend} {kind}", backend, kind)
    # The TP degree never changes logp or the entropy: both ranks hold the TP=1 bits.
    for r, res in enumerate(ranks):
        for backend, kind in compile_worker.CASES:
            for a, b in zip(res[(2, backend, kind)]["steps"], res[(1, backend, kind)]["steps"]):
                for name in ("logp", "entropy"):
                    assert_bitwise(a["compiled"][name], b["compiled"][name],
                                   f"rank {r} {backend}: {name} at TP=2 and TP=1")


def test_compiled_fused_lm_head_equals_eager():
    """The fused lm_head under torch.compile(fullgraph=True, dynamic=True): no graph break,
    one compilation for three token counts, logp, LSE and entropy eager's bit for bit, and the
    gradients of the hidden states and the weight too (a loss whose backward sends the op
    exactly its weights)."""
    import detlogp

    def loss_fn(hidden, weight, targets, w):
        logp, lse, entropy = detlogp.fused_linear_logprobs(hidden, weight, targets,
                                                           real_vocab=200, entropy=True)
        return (logp * w).sum() + (lse * w).sum() + (entropy * w).sum(), logp, lse, entropy

    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, fullgraph=True, dynamic=True)
    g = torch.Generator().manual_seed(3)
    weight = (torch.randn(256, 24, generator=g) * 0.3).bfloat16()
    for i, n in enumerate((5, 9, 14)):
        hidden = torch.randn(n, 24, generator=g).bfloat16()
        targets = torch.randint(0, 200, (n,), generator=g)
        targets[1] = -100
        w = torch.randn(n, generator=g)
        runs = []
        for fn in (loss_fn, compiled):
            h, wt = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
            with torch._dynamo.config.patch(error_on_recompile=fn is compiled and i > 0):
                out = fn(h, wt, targets, w)
            out[0].backward()
            runs.append([o.detach() for o in out[1:]] + [h.grad, wt.grad])
        for name, a, b in zip(("logp", "lse", "entropy", "grad_hidden", "grad_weight"), *runs):
            assert_bitwise(a, b, f"{n} tokens: {name}")
    explained = torch._dynamo.explain(loss_fn)(hidden, weight.requires_grad_(), targets, w)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()


def test_what_is_eager_only_says_so_under_compile():
    """return_contract=True and the fused op's contract= cannot cross a custom op: under
    torch.compile(fullgraph=True) the call fails with detlogp's message (torch reports it as
    the exception it observed while tracing)."""
    import detlogp
    import detlogp.torch as dt
    from helpers import contract

    x, ids = torch.randn(4, 256), torch.randint(0, 200, (4,))
    hidden, weight = torch.randn(4, 8), torch.randn(256, 8)
    c = contract(4, 200, 256)
    cases = {
        "return_contract=True is not available under torch.compile":
            lambda: dt.vocab_parallel_logprobs(x, ids, real_vocab=200, return_contract=True),
        "contract= is not available under torch.compile":
            lambda: detlogp.fused_linear_logprobs(hidden, weight, ids, contract=c),
    }
    for message, fn in cases.items():
        torch._dynamo.reset()
        with pytest.raises(Exception, match=message):
            torch.compile(fn, fullgraph=True)()
        fn()  # eager: fine
    torch._dynamo.reset()
