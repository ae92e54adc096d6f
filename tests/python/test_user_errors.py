"""Mistakes a new user makes with ``detlogp.torch``, and what they are told: every message names
what the user passed (or which default produced the value) and the fix, never a field of the
internal contract the user never saw. And ``detlogp.torch`` shows only its public API."""

import pytest
import torch

import detlogp
import detlogp.torch as dt


def mirror(rank=0, size=2):
    """A fake TP group whose other ranks send exactly what this one sends (no process)."""
    return detlogp._detlogp.CallbackComm(rank, size, "mirror", lambda send: send * size,
                                         lambda: None)


def message_of(fn):
    with pytest.raises(detlogp.LogprobContractError) as info:
        fn()
    return str(info.value)


def test_readme_example_on_a_toy_shard_names_real_vocab_and_the_logits_width():
    # The README's call, on logits of 1000 columns instead of a real LM head's shard.
    logits = torch.randn(2, 9, 1000)
    input_ids = torch.randint(0, 1000, (2, 9))
    response_mask = torch.ones(2, 9)
    text = message_of(lambda: dt.vocab_parallel_logprobs(
        logits[:, :-1], input_ids[:, 1:], real_vocab=151936, loss_mask=response_mask[:, 1:],
        entropy=True))
    assert text.startswith("real_vocab=151936 is larger than the vocabulary the logits hold: "
                           "1000 columns (logits.shape[-1]) x 1 TP rank(s) = 1000"), text
    assert "padded vocabulary inferred from the logits' width" in text  # the default's source
    assert "Pass real_vocab <= 1000" in text
    assert "detlogp.megatron_padded_vocab(151936, 1) = 151936 columns (151936 per rank)" in text
    assert "padded_vocab_size" not in text and "real_vocab_size" not in text


def test_real_vocab_beyond_a_vocab_start_table():
    text = message_of(lambda: dt.vocab_parallel_logprobs(
        torch.randn(3, 512), torch.zeros(3, dtype=torch.long), group=mirror(),
        vocab_start=[(0, 512), (512, 1024)], real_vocab=2000))
    assert text.startswith("real_vocab=2000 is larger than the vocabulary of the vocab_start "
                           "table, which ends at column 1024"), text


@pytest.mark.parametrize("group", [2, "tp", [0, 1]])
def test_a_non_group_says_what_group_must_be(group):
    for call in (lambda: dt.vocab_parallel_logprobs(torch.randn(3, 8), torch.zeros(3).long(),
                                                    group=group),
                 lambda: dt.vocab_parallel_cross_entropy(torch.randn(3, 8),
                                                         torch.zeros(3).long(), group=group),
                 lambda: detlogp.fused_linear_logprobs(torch.randn(3, 4), torch.randn(8, 4),
                                                       torch.zeros(3).long(), group=group)):
        text = message_of(call)
        assert "group must be a torch.distributed ProcessGroup (the TP group), a " \
               "detlogp.Communicator (detlogp.SelfComm() for one rank) or None; got " \
               f"{type(group).__name__} {group!r}" in text
        assert "initialized process group" not in text


def test_torch_module_shows_only_its_public_api():
    public = sorted(dt.__all__)
    assert dir(dt) == public
    namespace = {}
    exec("from detlogp.torch import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == public
    for name in public:
        assert not name.startswith("_") and getattr(dt, name) is not None
    for helper in ("np", "check_bool", "check_int", "cover_of", "ShardingSpec"):
        assert helper not in dir(dt)
