"""detlogp.sample (docs/python.md "Sampling on the rollout side"; docs/numerics.md "Sampling"):
its outputs bitwise equal to vocab_parallel_logprobs of the sampled tokens (full rows, kept
sets recomputed by top_k / top_p or given as kept_ids; a batch mixing restricted and
unrestricted rows replayed whole by top_k / top_p, or by kept_ids with empty_kept="full"), top-N the ranking's first ids with their
logprobs, greedy rows, a row alone equal to the row in a batch and any row order, the output
shapes, bad inputs named with the fix; at TP=3 over gloo with vLLM's unaligned bounds every
output equal to TP=1, ranks that disagree or hold a bad input fail together."""

import numpy as np
import pytest
import torch

import detlogp
from detlogp.torch import vocab_parallel_logprobs
from helpers import assert_bitwise
from spawn import run_workers

TIMEOUT_S = 240
ROWS, REAL = 8, 777


def _problem(dtype=torch.float32, rows=ROWS, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, REAL, generator=g) * 3).to(dtype)
    seeds = torch.randint(0, 2**40, (rows,), generator=g)
    positions = torch.arange(rows) * 11
    temperature = torch.tensor([1.0, 0.7, 0.0, 1.3, 0.5, 1.0, 0.0, 2.0])[:rows]
    top_k = torch.tensor([0, 40, 0, 0, 3, 0, 7, 0], dtype=torch.int32)[:rows]
    top_p = torch.tensor([1.0, 1.0, 0.9, 1.0, 1.0, 0.6, 0.5, 1.0])[:rows]
    return x, seeds, positions, dict(temperature=temperature, top_k=top_k, top_p=top_p)


def _scored_at(temperature):
    return torch.where(temperature == 0, torch.ones_like(temperature), temperature)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_outputs_are_the_trainers_logprobs_of_the_tokens(dtype):
    x, seeds, positions, p = _problem(dtype)
    out = detlogp.sample(x, seeds, positions, num_logprobs=3, softcap=25.0, **p)
    assert out.tokens.dtype == torch.int64 and out.tokens.shape == (ROWS,)
    tau = _scored_at(p["temperature"])
    full = vocab_parallel_logprobs(x, out.tokens, temperature=tau, softcap=25.0)
    assert_bitwise(out.full_logprobs, full, "full_logprobs")
    r = (p["top_k"] > 0) | (p["top_p"] < 1)
    kept = vocab_parallel_logprobs(x[r], out.tokens[r], temperature=tau[r], top_k=p["top_k"][r],
                                   top_p=p["top_p"][r], softcap=25.0)
    assert_bitwise(out.logprobs[r], kept, "logprobs (top_k/top_p recomputed)")
    given = vocab_parallel_logprobs(x[r], out.tokens[r], temperature=tau[r], softcap=25.0,
                                    kept_ids=out.kept[r])
    assert_bitwise(out.logprobs[r], given, "logprobs (kept_ids=)")
    assert_bitwise(out.logprobs[~r], out.full_logprobs[~r], "unrestricted rows")
    assert (out.kept[~r] == -1).all()
    for row in torch.nonzero(r).flatten().tolist():
        assert out.tokens[row] in out.kept[row]
    # top-N: the ranking's first ids (z descending, id ascending) and their full logprobs.
    for j in range(3):
        top = vocab_parallel_logprobs(x, out.top_ids[:, j], temperature=tau, softcap=25.0)
        assert_bitwise(out.top_logprobs[:, j], top, f"top logprob {j}")
    assert (out.top_logprobs[:, :-1] >= out.top_logprobs[:, 1:]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_mixed_batch_replays_whole_with_the_samplers_top_k_and_top_p(dtype):
    # Restricted and unrestricted rows in one trainer call: each row scored as the sampler did.
    x, seeds, positions, p = _problem(dtype)
    out = detlogp.sample(x, seeds, positions, softcap=25.0, **p)
    tau = _scored_at(p["temperature"])
    lp, ent = vocab_parallel_logprobs(x, out.tokens, temperature=tau, top_k=p["top_k"],
                                      top_p=p["top_p"], softcap=25.0, entropy=True)
    assert_bitwise(lp, out.logprobs, "mixed batch, top_k/top_p recomputed")
    r = (p["top_k"] > 0) | (p["top_p"] < 1)
    _, full_ent = vocab_parallel_logprobs(x[~r], out.tokens[~r], temperature=tau[~r],
                                          softcap=25.0, entropy=True)
    assert_bitwise(ent[~r], full_ent, "unrestricted rows' entropy")
    # Backward: the unrestricted rows' gradient is the plain call's.
    xg = x.detach().clone().float().requires_grad_(True)
    vocab_parallel_logprobs(xg, out.tokens, temperature=tau, top_k=p["top_k"], top_p=p["top_p"],
                            softcap=25.0).sum().backward()
    xf = x[~r].detach().clone().float().requires_grad_(True)
    vocab_parallel_logprobs(xf, out.tokens[~r], temperature=tau[~r],
                            softcap=25.0).sum().backward()
    assert_bitwise(xg.grad[~r], xf.grad, "unrestricted rows' gradient")
    # The sampler's kept sets handed back whole: all -1 rows over the full vocabulary.
    given = vocab_parallel_logprobs(x, out.tokens, temperature=tau, softcap=25.0,
                                    kept_ids=out.kept, empty_kept="full")
    assert_bitwise(given, out.logprobs, "mixed batch, kept_ids= with empty_kept='full'")
    with pytest.raises(detlogp.LogprobContractError, match="empty_kept=full"):
        vocab_parallel_logprobs(x, out.tokens, temperature=tau, softcap=25.0, kept_ids=out.kept)
    with pytest.raises(detlogp.LogprobContractError, match="'error' or 'full'"):
        vocab_parallel_logprobs(x, out.tokens, kept_ids=out.kept, empty_kept="all")


def test_greedy_rows_take_the_lowest_id_of_the_largest_logit():
    x = torch.randn(4, REAL)
    x[0, [5, 300, 700]] = 50.0
    x[1, [2, 9]] = 40.0
    out = detlogp.sample(x, torch.arange(4), torch.arange(4), temperature=0.0)
    assert out.tokens[:2].tolist() == [5, 2]
    assert out.tokens[2:].tolist() == x[2:].argmax(dim=1).tolist()
    # Scored at temperature 1.
    assert_bitwise(out.logprobs, vocab_parallel_logprobs(x, out.tokens), "greedy logprobs")


def test_a_row_is_the_same_alone_in_a_batch_and_in_any_order():
    x, seeds, positions, p = _problem()
    batch = detlogp.sample(x, seeds, positions, num_logprobs=2, **p)
    order = torch.tensor([3, 0, 7, 5, 1, 6, 2, 4])
    permuted = detlogp.sample(x[order], seeds[order], positions[order], num_logprobs=2,
                              **{k: v[order] for k, v in p.items()})
    for name in ("tokens", "logprobs", "full_logprobs", "top_ids", "top_logprobs"):
        assert_bitwise(getattr(batch, name)[order].float(), getattr(permuted, name).float(), name)
    for row in (0, 2, 4):
        alone = detlogp.sample(x[row:row + 1], seeds[row:row + 1], positions[row:row + 1],
                               **{k: v[row:row + 1] for k, v in p.items()})
        assert alone.tokens.item() == batch.tokens[row].item()
        assert_bitwise(alone.logprobs, batch.logprobs[row:row + 1], f"row {row} alone")


def test_shapes_without_restriction_and_without_rows():
    x, seeds, positions, _ = _problem()
    out = detlogp.sample(x, seeds, positions, temperature=0.8)
    assert out.kept.shape == (ROWS, 0) and out.top_ids.shape == (ROWS, 0)
    assert_bitwise(out.logprobs, out.full_logprobs, "unrestricted")
    assert isinstance(out, detlogp.SampleOutput)
    empty = detlogp.sample(x[:0], seeds[:0], positions[:0], num_logprobs=2)
    assert empty.tokens.shape == (0,) and empty.top_ids.shape == (0, 2)
    # A scalar seed and position are every row's.
    one = detlogp.sample(x, 7, 3)
    many = detlogp.sample(x, torch.full((ROWS,), 7), torch.full((ROWS,), 3))
    assert torch.equal(one.tokens, many.tokens)


@pytest.mark.parametrize("edit, field, says", [
    (dict(positions=torch.tensor([0, 1, 2, -4, 4, 5, 6, 7])), "positions",
     "position of row 3 is -4"),
    (dict(seeds=torch.arange(3)), "seeds", "seeds has 3 entries but there are 8 rows"),
    (dict(temperature=-1.0), "temperature", "temperature of row 0 is -1"),
    (dict(temperature=float("nan")), "temperature", "must be a finite number >= 0"),
    (dict(top_k=2000), "top_k", "top_k of row 0 is 2000"),
    (dict(top_p=1.5), "top_p", "top_p of row 0 is 1.5"),
    (dict(num_logprobs=778), "num_logprobs", "num_logprobs is 778"),
])
def test_bad_inputs_name_the_field_and_the_value(edit, field, says):
    x, seeds, positions, _ = _problem()
    kw = dict(seeds=seeds, positions=positions)
    kw.update(edit)
    s, pos = kw.pop("seeds"), kw.pop("positions")
    with pytest.raises(detlogp.LogprobContractError, match=says) as info:
        detlogp.sample(x, s, pos, **kw)
    assert info.value.field == field


def test_a_seed_is_its_64_bits():
    x, _, positions, _ = _problem()
    big = 2**64 - 5  # a uint64 seed: the int64 with the same bits
    a = detlogp.sample(x, big, positions)
    b = detlogp.sample(x, torch.full((ROWS,), -5), positions)
    c = detlogp.sample(x, [big] * ROWS, positions)
    d = detlogp.sample(x, np.full(ROWS, big, dtype=np.uint64), positions)
    for other in (b, c, d):
        assert torch.equal(a.tokens, other.tokens)
    with pytest.raises(detlogp.LogprobContractError, match="does not fit in 64 bits"):
        detlogp.sample(x, 2**64, positions)


def test_rows_with_nan_logits_fail():
    x, seeds, positions, _ = _problem()
    x[3, 10] = float("nan")
    with pytest.raises(detlogp.LogprobContractError, match="non-finite logsumexp") as info:
        detlogp.sample(x, seeds, positions)
    assert info.value.field == "local_logits"


def test_python_side_type_errors():
    x, seeds, positions, _ = _problem()
    with pytest.raises(detlogp.LogprobContractError, match="seeds must hold integers"):
        detlogp.sample(x, seeds.float(), positions)
    with pytest.raises(detlogp.LogprobContractError, match="2-D strided tensor"):
        detlogp.sample(x[None], seeds, positions)
    with pytest.raises(detlogp.LogprobContractError, match="temperature must be a number"):
        detlogp.sample(x, seeds, positions, temperature="hot")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    import sample_worker

    return run_workers(sample_worker.main, tmp_path_factory.mktemp("sample"), 3, TIMEOUT_S,
                       pass_world=False)[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tp3_at_vllm_bounds_gives_the_tp1_outputs(ranks, dtype):
    for rank, res in enumerate(ranks):
        got, ref = res[dtype], res[dtype + " reference"]
        for name, value in ref.items():
            a, b = got[name], value
            assert a.shape == b.shape, (rank, name)
            if a.dtype == torch.int64:
                assert torch.equal(a, b), (rank, name)
            else:
                assert_bitwise(a, b, f"{dtype} {name} rank {rank}")
        train = res[dtype + " trainer"]
        r = train["restricted"]
        assert_bitwise(got["full_logprobs"], train["full"], f"trainer full rank {rank}")
        assert_bitwise(got["logprobs"][r], train["recomputed"], f"trainer top_k/p rank {rank}")
        assert_bitwise(got["logprobs"][r], train["kept"], f"trainer kept_ids rank {rank}")


def test_tp3_ranks_that_disagree_or_fail_locally_fail_together(ranks):
    for rank, res in enumerate(ranks):
        assert "ranks disagree on the seeds" in res["disagree"].get("error", ""), res["disagree"]
        assert res["disagree"]["field"] == "seeds"
        msg = res["bad position"].get("error", "")
        if rank == 1:
            assert "position of row 4 is -3" in msg, msg
        else:
            assert "rank 1 failed local validation" in msg, msg
        assert torch.equal(res["after"]["tokens"], ranks[0]["after"]["tokens"])
