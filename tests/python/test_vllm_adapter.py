"""detlogp.vllm.DetlogpSampler, vLLM's sampler replaced by detlogp.sample, against the stand-in
of vLLM's V1 sampler interface (vllm_standin.py: why not the real package): its tokens and
logprobs are bitwise detlogp.sample's and the trainer's vocab_parallel_logprobs' on the same
rows (temperature, greedy rows, top_k, top_p, rows that mix them), in both logprobs modes; the
output has vLLM's layout (int32 [rows, 1] tokens, the sampled token then the top N, ranks); a
row's output does not depend on the batch it is in nor on the row order; seeds come from the
requests' generators; what the canon cannot honour raises naming the field."""

import pytest
import torch

import detlogp
import vllm_standin as vs
from detlogp import LogprobContractError
from detlogp.torch import vocab_parallel_logprobs
from detlogp.vllm import DetlogpSampler
from helpers import assert_bitwise

VOCAB = 1000  # vLLM trims the padding before the sampler: full rows of the real vocabulary
SELF = detlogp.SelfComm()

# One request per row: (seed, temperature, top_k, top_p, position); top_k 0 / top_p 1 = off.
REQUESTS = [
    (11, 1.0, 0, 1.0, 0),
    (12, 0.0, 0, 1.0, 3),  # greedy
    (13, 0.7, 50, 1.0, 7),
    (14, 1.3, 0, 0.9, 2),
    (2**64 - 5, 0.9, 20, 0.8, 40),  # a seed past 2^63: its 64 bits as int64
    (16, 1.0, 0, 1.0, 1),
    (17, 2.0, 1, 1.0, 5),  # top_k 1: the kept set is the top token
    (18, 0.0, 0, 1.0, 9),  # greedy
]


def logits_of(rows, stream=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(stream)
    x = torch.randn(rows, VOCAB, generator=g) * 3
    x[:, 100:110] = x[:, 100:110].round()  # some exact ties
    return x.to(dtype)


def metadata(requests, num_logprobs=4, **kw):
    """vLLM's metadata for these requests, as its input batch builds it."""
    t = torch.tensor([r[1] for r in requests], dtype=torch.float32)
    greedy = t < 1e-5
    k = torch.tensor([r[2] if 0 < r[2] < VOCAB else VOCAB for r in requests], dtype=torch.int32)
    p = torch.tensor([r[3] for r in requests], dtype=torch.float32)
    fields = dict(
        temperature=None if bool(greedy.all()) else t, all_greedy=bool(greedy.all()),
        all_random=not bool(greedy.any()), top_p=None if bool((p == 1).all()) else p,
        top_k=None if bool((k == VOCAB).all()) else k,
        generators={i: vs.generator(r[0]) for i, r in enumerate(requests) if r[0] is not None},
        max_num_logprobs=num_logprobs, output_token_ids=[[7] * r[4] for r in requests])
    fields.update(kw)
    return vs.SamplingMetadata(**fields)


def reference(logits, requests, num_logprobs=4):
    """detlogp.sample called directly with the requests' parameters."""
    seeds = [r[0] - 2**64 if r[0] >= 2**63 else r[0] for r in requests]
    t = torch.tensor([r[1] for r in requests], dtype=torch.float32)
    k = torch.tensor([r[2] for r in requests], dtype=torch.int32)
    p = torch.tensor([r[3] for r in requests], dtype=torch.float32)
    return detlogp.sample(logits, torch.tensor(seeds), torch.tensor([r[4] for r in requests]),
                          temperature=t, top_k=k, top_p=p, num_logprobs=num_logprobs,
                          group=SELF)


def scored_temperature(requests):
    """The temperature each row is scored at: its own, 1 for greedy rows."""
    return torch.tensor([r[1] if r[1] > 0 else 1.0 for r in requests], dtype=torch.float32)


def restricted(requests):
    return torch.tensor([r[2] > 0 or r[3] < 1 for r in requests])


def run(logits, requests, mode="processed_logprobs", **kw):
    sampler = DetlogpSampler(logprobs_mode=mode, outputs=vs)
    return sampler(logits, metadata(requests, **kw)), sampler


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tokens_and_logprobs_are_detlogp_samples_and_the_trainers(dtype):
    logits = logits_of(len(REQUESTS), dtype=dtype)
    out, sampler = run(logits, REQUESTS)
    ref = reference(logits, REQUESTS)
    tokens = out.sampled_token_ids
    assert tokens.dtype == torch.int32 and tokens.shape == (len(REQUESTS), 1)
    assert torch.equal(tokens.view(-1).long(), ref.tokens)
    lt = out.logprobs_tensors
    assert lt.logprob_token_ids.dtype == torch.int32 and lt.logprobs.dtype == torch.float32
    assert lt.logprob_token_ids.shape == lt.logprobs.shape == (len(REQUESTS), 5)
    assert torch.equal(lt.logprob_token_ids[:, 0].long(), ref.tokens)
    assert_bitwise(lt.logprobs[:, 0], ref.logprobs, "sampled token's logprob")
    assert torch.equal(sampler.last.sample.kept, ref.kept)
    assert_bitwise(sampler.last.sample.full_logprobs, ref.full_logprobs, "full_logprobs")

    # The trainer on the same rows: the kept sets given back, or recomputed from top_k/top_p;
    # the unrestricted rows with the plain call. Greedy rows are scored at temperature 1.
    t, cut = scored_temperature(REQUESTS), restricted(REQUESTS)
    r, u = cut.nonzero().view(-1), (~cut).nonzero().view(-1)
    toks = ref.tokens
    given = vocab_parallel_logprobs(logits[r], toks[r], group=SELF, temperature=t[r],
                                    kept_ids=ref.kept[r])
    recomputed = vocab_parallel_logprobs(
        logits[r], toks[r], group=SELF, temperature=t[r],
        top_k=torch.tensor([REQUESTS[i][2] for i in r], dtype=torch.int32),
        top_p=torch.tensor([REQUESTS[i][3] for i in r], dtype=torch.float32))
    plain = vocab_parallel_logprobs(logits[u], toks[u], group=SELF, temperature=t[u])
    assert_bitwise(lt.logprobs[r, 0], given, "restricted rows, kept_ids given")
    assert_bitwise(lt.logprobs[r, 0], recomputed, "restricted rows, top_k/top_p")
    assert_bitwise(lt.logprobs[u, 0], plain, "unrestricted rows")
    full = vocab_parallel_logprobs(logits, toks, group=SELF, temperature=t)
    assert_bitwise(sampler.last.sample.full_logprobs, full, "full-vocabulary logprobs")


def test_processed_top_n_and_ranks():
    logits = logits_of(len(REQUESTS), stream=1)
    out, sampler = run(logits, REQUESTS, num_logprobs=30)
    ref = reference(logits, REQUESTS, num_logprobs=30)
    lt = out.logprobs_tensors
    ids, lps = lt.logprob_token_ids[:, 1:].long(), lt.logprobs[:, 1:]
    assert torch.equal(ids, ref.top_ids)  # a kept set is a prefix of the ranking
    t, cut = scored_temperature(REQUESTS), restricted(REQUESTS)
    for row in range(len(REQUESTS)):
        x = logits[row].expand(30, VOCAB)
        tr = t[row].expand(30).contiguous()
        if cut[row]:
            kept = ref.kept[row].expand(30, ref.kept.shape[1])
            want = vocab_parallel_logprobs(x, ids[row], group=SELF, temperature=tr,
                                           kept_ids=kept, outside_kept="neg_inf")
            size = int((ref.kept[row] >= 0).sum())
            assert bool(torch.isinf(lps[row, size:]).all())
            assert bool(lps[row, :size].isfinite().all())
        else:
            want = vocab_parallel_logprobs(x, ids[row], group=SELF, temperature=tr)
            assert_bitwise(want, ref.top_logprobs[row], f"row {row} top logprobs")
        assert_bitwise(lps[row], want, f"row {row} top logprobs")
        # vLLM's rank: how many ids have a processed logprob at least the token's.
        every = vocab_parallel_logprobs(logits[row].expand(VOCAB, VOCAB), torch.arange(VOCAB),
                                        group=SELF, temperature=t[row].expand(VOCAB).contiguous(),
                                        **({"kept_ids": ref.kept[row].expand(VOCAB, -1),
                                            "outside_kept": "neg_inf"} if cut[row] else {}))
        assert int(lt.selected_token_ranks[row]) == int((every >= lt.logprobs[row, 0]).sum())
    assert int(lt.selected_token_ranks[6]) == 1  # top_k 1


def test_raw_mode_is_the_full_vocabulary_at_temperature_one():
    logits = logits_of(len(REQUESTS), stream=2)
    out, _ = run(logits, REQUESTS, mode="raw_logprobs", num_logprobs=6)
    ref = reference(logits, REQUESTS, num_logprobs=0)
    lt = out.logprobs_tensors
    assert torch.equal(lt.logprob_token_ids[:, 0].long(), ref.tokens)
    raw = vocab_parallel_logprobs(logits, ref.tokens, group=SELF)
    assert_bitwise(lt.logprobs[:, 0], raw, "raw logprob of the token")
    top = torch.sort(logits, dim=1, descending=True, stable=True).indices[:, :6]
    assert torch.equal(lt.logprob_token_ids[:, 1:].long(), top)
    for j in range(6):
        assert_bitwise(lt.logprobs[:, 1 + j],
                       vocab_parallel_logprobs(logits, top[:, j].contiguous(), group=SELF),
                       f"raw top {j}")
    # vLLM's raw_logprobs: log_softmax of the logits as given
    ls = torch.log_softmax(logits.double(), -1)
    assert torch.allclose(lt.logprobs.double(), ls.gather(1, lt.logprob_token_ids.long()),
                          atol=1e-5)
    assert torch.equal(lt.selected_token_ranks,
                       (logits >= logits.gather(1, ref.tokens.view(-1, 1))).sum(1))


def test_per_row_mode_override():
    logits = logits_of(len(REQUESTS), stream=3)
    modes = ["raw_logprobs", None] * 4
    processed, _ = run(logits, REQUESTS)
    raw, _ = run(logits, REQUESTS, mode="raw_logprobs")
    mixed, _ = run(logits, REQUESTS, logprobs_mode_override=modes)
    for row, m in enumerate(modes):
        want = raw if m == "raw_logprobs" else processed
        for f in ("logprob_token_ids", "logprobs", "selected_token_ranks"):
            assert_bitwise(getattr(mixed.logprobs_tensors, f)[row].float(),
                           getattr(want.logprobs_tensors, f)[row].float(), f"{f} row {row}")


def test_batch_composition_and_row_order():
    logits = logits_of(len(REQUESTS), stream=4)
    full, _ = run(logits, REQUESTS)
    perm = [5, 2, 7, 0, 3, 6, 1, 4]
    permuted, _ = run(logits[perm], [REQUESTS[i] for i in perm])
    for f in ("logprob_token_ids", "logprobs", "selected_token_ranks"):
        assert_bitwise(getattr(permuted.logprobs_tensors, f).float(),
                       getattr(full.logprobs_tensors, f)[perm].float(), f)
    assert torch.equal(permuted.sampled_token_ids, full.sampled_token_ids[perm])
    for row in (0, 2, 4, 6):
        alone, _ = run(logits[row:row + 1], REQUESTS[row:row + 1])
        assert torch.equal(alone.sampled_token_ids[0], full.sampled_token_ids[row])
        assert_bitwise(alone.logprobs_tensors.logprobs[0], full.logprobs_tensors.logprobs[row],
                       f"row {row} alone")


def test_greedy_rows_take_the_first_argmax_at_temperature_one():
    logits = logits_of(4, stream=5)
    logits[:, 500] = logits[:, 100:110].max(1).values.clamp(min=20)  # a tie with a lower id
    logits[:, 103] = logits[:, 500]
    greedy = [(s, 0.0, 0, 1.0, pos) for s, pos in ((1, 0), (2, 5), (3, 9), (None, 2))]
    md = metadata(greedy, temperature=None)
    assert md.all_greedy
    out = DetlogpSampler(seed=99, outputs=vs)(logits, md)
    tokens = out.sampled_token_ids.view(-1).long()
    assert torch.equal(tokens, logits.argmax(1))  # torch's argmax: the first maximum
    assert torch.equal(tokens, torch.full((4,), 103))
    assert_bitwise(out.logprobs_tensors.logprobs[:, 0],
                   vocab_parallel_logprobs(logits, tokens, group=SELF), "greedy logprobs")
    assert torch.equal(out.logprobs_tensors.selected_token_ranks, torch.full((4,), 2))
    # vLLM's greedy rule: a temperature below 1e-5 (its input batch stores greedy rows' as 0
    # or -1)
    tiny = [(1, 5e-6, 0, 1.0, 0), (2, -1.0, 0, 1.0, 0), (3, 1.0, 0, 1.0, 0)]
    sampler = DetlogpSampler(outputs=vs)
    out = sampler(logits[:3], metadata(tiny))
    assert out.sampled_token_ids.view(-1)[:2].tolist() == [103, 103]
    assert sampler.last.temperature.tolist() == [0.0, 0.0, 1.0]


def test_seeds_positions_and_their_sources():
    logits = logits_of(len(REQUESTS), stream=6)
    base, _ = run(logits, REQUESTS)
    # explicit positions, and positions_fn, override output_token_ids
    pos = torch.tensor([r[4] for r in REQUESTS])
    empty = metadata(REQUESTS, output_token_ids=[])
    a = DetlogpSampler(outputs=vs)(logits, empty, positions=pos)
    b = DetlogpSampler(outputs=vs, positions_fn=lambda md, rows: pos)(logits, empty)
    assert torch.equal(a.sampled_token_ids, base.sampled_token_ids)
    assert torch.equal(b.sampled_token_ids, base.sampled_token_ids)
    moved = DetlogpSampler(outputs=vs)(logits, empty, positions=pos + 1)
    assert not torch.equal(moved.sampled_token_ids, base.sampled_token_ids)
    # rows without a generator take the sampler's seed
    unseeded = [(None,) + r[1:] for r in REQUESTS]
    c = DetlogpSampler(seed=12345, outputs=vs)(logits, metadata(unseeded))
    want = detlogp.sample(logits, torch.full((len(REQUESTS),), 12345), pos,
                          temperature=torch.tensor([r[1] for r in REQUESTS]),
                          top_k=torch.tensor([r[2] for r in REQUESTS], dtype=torch.int32),
                          top_p=torch.tensor([r[3] for r in REQUESTS]), group=SELF)
    assert torch.equal(c.sampled_token_ids.view(-1).long(), want.tokens)


def test_logprobs_only_when_asked():
    logits = logits_of(3, stream=7)
    out, _ = run(logits, REQUESTS[:3], num_logprobs=None)
    assert out.logprobs_tensors is None
    out, _ = run(logits, REQUESTS[:3], num_logprobs=0)
    assert out.logprobs_tensors.logprobs.shape == (3, 1)


@pytest.mark.parametrize("kw, field", [
    ({"no_penalties": False}, "presence_penalties"),
    ({"allowed_token_ids_mask": torch.zeros(8, VOCAB, dtype=torch.bool)},
     "allowed_token_ids_mask"),
    ({"bad_words_token_ids": {0: [[5, 6]]}}, "bad_words_token_ids"),
    ({"logitsprocs": vs.LogitsProcessors(argmax_invariant=[vs.MinPLogitsProcessor(1)])},
     "min_p"),
    ({"logitsprocs": vs.LogitsProcessors(
        non_argmax_invariant=[vs.LogitBiasLogitsProcessor({0: {5: 1.0}})])}, "logit_bias"),
    ({"logitsprocs": vs.LogitsProcessors(
        non_argmax_invariant=[vs.MinTokensLogitsProcessor({0: (3, [], {2})})])}, "min_tokens"),
    ({"logitsprocs": vs.LogitsProcessors(
        non_argmax_invariant=[vs.SomeCustomLogitsProcessor()])}, "logitsprocs"),
    ({"max_num_logprobs": -1}, "max_num_logprobs"),
    ({"output_token_ids": []}, "positions"),
    ({"generators": {}}, "generators"),
    ({"logprobs_mode_override": "raw_logits"}, "logprobs_mode"),
    ({"predict_bonus_token": True}, "predict_bonus_token"),
])
def test_what_it_cannot_honour_raises_naming_the_field(kw, field):
    logits = logits_of(len(REQUESTS), stream=8)
    bonus = kw.pop("predict_bonus_token", False)
    sampler = DetlogpSampler(outputs=vs)
    with pytest.raises(LogprobContractError) as err:
        sampler(logits, metadata(REQUESTS, **kw), predict_bonus_token=bonus)
    assert err.value.field == field
    assert field in str(err.value)
    assert sampler.last is None  # nothing sampled


def test_inactive_builtin_processors_are_accepted_and_bad_modes_refused():
    logits = logits_of(2, stream=9)
    out, _ = run(logits, REQUESTS[:2])  # the default LogitsProcessors: all three, inactive
    assert out.sampled_token_ids.shape == (2, 1)
    with pytest.raises(LogprobContractError, match="processed_logits"):
        DetlogpSampler(logprobs_mode="processed_logits")
    with pytest.raises(LogprobContractError, match="one value per logits row"):
        run(logits, REQUESTS[:2], temperature=torch.tensor([1.0, 1.0, 1.0]))


def test_without_vllm_the_outputs_must_be_given():
    """vLLM is not a test dependency: where it is absent, the error says what to pass."""
    try:
        import vllm.v1.outputs  # noqa: F401
        pytest.skip("vLLM is installed")
    except ImportError:
        pass
    with pytest.raises(ImportError, match="pass outputs="):
        DetlogpSampler()(logits_of(2), metadata(REQUESTS[:2]))


def test_raw_top_n_among_many_ties_is_the_stable_ranking():
    g = torch.Generator().manual_seed(10)
    logits = torch.randint(-4, 4, (len(REQUESTS), VOCAB), generator=g).to(torch.float32)
    out, _ = run(logits, REQUESTS, mode="raw_logprobs", num_logprobs=17)
    top = torch.sort(logits, dim=1, descending=True, stable=True).indices[:, :17]
    lt = out.logprobs_tensors
    assert torch.equal(lt.logprob_token_ids[:, 1:].long(), top)
    tokens = lt.logprob_token_ids[:, 0].long()
    assert torch.equal(lt.selected_token_ranks,
                       (logits >= logits.gather(1, tokens.view(-1, 1))).sum(1))
