"""detlogp's drop-ins against the real functions they replace: Megatron's
``vocab_parallel_cross_entropy`` and verl's ``logprobs_from_logits``,
``vocab_parallel_log_probs_from_logits``, ``vocab_parallel_entropy`` and
``entropy_from_logits`` (the versions pinned in python/requirements/peers.txt, loaded by
peers.py), on the same logits over gloo at TP = 1, 2 and 4 (4 spawned ranks, peers_worker.py):

- they accept the real functions' parameters (names, order, kinds, defaults);
- without ``group=`` they run over Megatron's initialized TP group (Megatron's real
  parallel state);
- their outputs and logits gradients agree with the real ones within the bounds of TOL, and
  they never write into the logits (Megatron's writes into fp32 logits);
- theirs are bitwise equal at every TP degree, where the real ones differ (the counts are
  printed; docs/python.md, "Drop-ins", lists them).

Skips, saying why and how to install them, when the pinned peers are not installed for this
interpreter.
"""

import pytest
import torch

import peers
from helpers import assert_bitwise, bits
from spawn import run_workers

pytestmark = pytest.mark.skipif(peers.missing_reason() is not None,
                                reason=str(peers.missing_reason()))

WORLD = 4
TIMEOUT_S = 600
DTYPES = ("float32", "bfloat16")
TP_PARALLEL = ["vocab_parallel_cross_entropy", "vocab_parallel_cross_entropy tp_group",
               "vocab_parallel_log_probs_from_logits", "vocab_parallel_entropy"]
ONE_RANK = ["logprobs_from_logits", "entropy_from_logits"]
ENTROPY = {"vocab_parallel_entropy", "entropy_from_logits"}

# |detlogp - real|, per element, for the outputs (logp or loss about 8..25 in magnitude,
# entropy about 4..7 on these logits) and the logits gradients, by what is compared and the
# dtype the real function returns it in. Both sides sum exponentials of 32768 columns in fp32,
# in different orders (detlogp: its canonical tile tree; the real ones: torch's reductions per
# shard, then an all-reduce), so in fp32 they agree to a few ulps (1.9e-6 at 16..32), except
# where verl forms the entropy as lse - sum(p * x): two terms of about 20 whose rounding
# cancels to an entropy of about 5. verl computes in the logits' dtype: with bf16 logits its
# logp, entropy and gradients are rounded to bf16 (8 significant bits) at every step (x - max,
# exp, p, p * x), and returned in bf16; Megatron computes and returns fp32 for bf16 logits.
# The largest differences measured (pinned versions, this file's inputs) are noted.
TOL = {
    ("logp", "float32"): 1e-5,  # measured 1.9e-6 (1 ulp)
    ("logp", "bfloat16"): 0.125,  # verl's bf16 logp: half an ulp at 16..32, measured 0.068
    ("entropy", "float32"): 1e-4,  # measured 2.4e-5 (verl's cancellation)
    ("entropy", "bfloat16"): 0.25,  # verl's bf16 entropy: 8 ulps at 4..8, measured 0.14
    ("logp grad", "float32"): 1e-6,  # softmax - one-hot, times a weight of about 1: 1.8e-7
    ("logp grad", "bfloat16"): 1 / 64,  # the gradient in bf16: 1 ulp at 2..4, measured 0.004
    ("entropy grad", "float32"): 1e-4,  # measured 2.1e-5 (verl's cancellation)
    ("entropy grad", "bfloat16"): 1 / 16,  # measured 0.023
}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import peers_worker

    return run_workers(peers_worker.main, tmp_path_factory.mktemp("peers"), WORLD, TIMEOUT_S)[0]


def _cases():
    for dtype in DTYPES:
        for name in TP_PARALLEL:
            for tp in (1, 2, 4):
                yield name, dtype, tp
        for name in ONE_RANK:
            yield name, dtype, 1


def test_signatures_accept_the_real_ones(ranks):
    """Every parameter of the real function is one of ours, at the same position, of the same
    kind, with the same default: a call that binds to the real one binds to ours."""
    sigs = ranks[0]["signatures"]
    assert sorted(sigs) == sorted(TP_PARALLEL[:1] + TP_PARALLEL[2:] + ONE_RANK)
    for name, (real, ours) in sigs.items():
        assert ours[:len(real)] == real, (name, real, ours)
        # What ours adds is keyword-only with a default: no real call can reach it.
        assert all(kind == "KEYWORD_ONLY" for _, kind, _ in ours[len(real):]), (name, ours)


@pytest.mark.parametrize("name,dtype,tp", list(_cases()))
def test_drop_ins_match_the_real_functions(ranks, name, dtype, tp):
    kind = "entropy" if name in ENTROPY else "logp"
    for rank, res in enumerate(ranks):
        real, ours = res[f"{name} real {dtype} tp{tp}"], res[f"{name} detlogp {dtype} tp{tp}"]
        out_dtype = str(real["value"].dtype).removeprefix("torch.")
        assert ours["value"].dtype == torch.float32 and ours["value"].shape == real["value"].shape
        assert ours["grad dtype"] == real["grad dtype"] == getattr(torch, dtype)
        assert torch.isfinite(ours["value"]).all()
        d = (ours["value"].double() - real["value"].double()).abs().max().item()
        assert d <= TOL[(kind, out_dtype)], (rank, "value", d)
        g = ours["grad max diff"]
        assert g <= TOL[(kind + " grad", dtype)], (rank, "grad", g)
        assert not ours["wrote into the logits"], rank


def test_megatron_writes_into_fp32_logits_detlogp_does_not(ranks):
    """Why the real functions run on a copy (and what the drop-in spares its caller)."""
    for res in ranks:
        for tp in (1, 2, 4):
            assert res[f"vocab_parallel_cross_entropy real float32 tp{tp}"]["wrote into the logits"]
            assert not res[f"vocab_parallel_cross_entropy detlogp float32 tp{tp}"][
                "wrote into the logits"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("name", TP_PARALLEL)
def test_drop_ins_are_bitwise_equal_across_tp(ranks, name, dtype, tp):
    for rank, res in enumerate(ranks):
        got, ref = res[f"{name} detlogp {dtype} tp{tp}"], res[f"{name} detlogp {dtype} tp1"]
        assert_bitwise(got["value"], ref["value"], f"{name} rank {rank}")
        assert got["grad rows as at tp1"].all(), f"{name} gradient rank {rank}"


def test_megatrons_tp_group_is_the_default(ranks):
    """Without ``group=`` the drop-ins run over Megatron's initialized TP group: the loss is
    the one over tp_group, passed as Megatron's fourth argument; verl's helper is its negation."""
    for res in ranks:
        for dtype in DTYPES:
            for tp in (1, 2, 4):
                loss = res[f"vocab_parallel_cross_entropy detlogp {dtype} tp{tp}"]["value"]
                assert_bitwise(res[f"vocab_parallel_cross_entropy tp_group detlogp {dtype} tp{tp}"]
                               ["value"], loss)
                assert_bitwise(res[f"vocab_parallel_log_probs_from_logits detlogp {dtype} tp{tp}"]
                               ["value"], -loss)


def real_tokens_that_differ(ranks, name, dtype, tp):
    """(tokens whose output, tokens whose logits gradient row, tokens) that differ at TP=tp
    from TP=1 for the real function, over every rank."""
    out = grad = None
    for res in ranks:
        got, ref = res[f"{name} real {dtype} tp{tp}"], res[f"{name} real {dtype} tp1"]
        o = bits(got["value"]) != bits(ref["value"])
        g = ~got["grad rows as at tp1"].numpy()
        out = o if out is None else out | o
        grad = g if grad is None else grad | g
    return int(out.sum()), int(grad.sum()), out.size


@pytest.mark.parametrize("name", ["vocab_parallel_cross_entropy", "vocab_parallel_entropy"])
def test_the_real_functions_are_not_bitwise_equal_across_tp(ranks, name):
    counts = {(dtype, tp): real_tokens_that_differ(ranks, name, dtype, tp)
              for dtype in DTYPES for tp in (2, 4)}
    for (dtype, tp), (out, grad, tokens) in counts.items():
        print(f"{name} {dtype} TP=1 vs TP={tp}: {out} of {tokens} tokens differ in the output, "
              f"{grad} in the logits gradient")
    assert all(out + grad > 0 for out, grad, _ in counts.values()), counts
