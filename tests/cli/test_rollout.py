"""detlogp rollout (in-process rank groups), small sizes: tokens sampled at vLLM's layout and
scored at Megatron's have the same logprob bits (0 differing tokens, exit 0) for every pairing,
dtype and sampling configuration; the sampled tokens do not depend on the rollout's layout; the
plain fp32 arithmetic is counted; bad --pairs exit 2."""

import pytest

from cli_helpers import run_cli, run_json

SMALL = ["--rows", 48, "--real-vocab", 3000, "--threads", 2]


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_rollout_and_trainer_bits_equal(dtype):
    r = run_json("rollout", *SMALL, "--dtype", dtype, "--pairs", "3:1,4:2,8:2,1:1")
    assert r["passed"] is True and r["rows"] == 48 and r["real_vocab"] == 3000
    runs = r["runs"]
    assert len(runs) == 8
    for run in runs:
        assert run["differ"] == 0 and run["replicated"], run
        assert run["tokens"] == 48 and isinstance(run["plain_differ"], int)
        if run["sampling"] == "per-row":
            assert 0 < run["restricted"] < 48 and 0 < run["greedy"] < 48, run
        else:
            assert run["restricted"] == 0 and run["greedy"] == 0, run
        if run["train_tp"] == 1:
            # One trainer shard sums in the gathered row's order: plain arithmetic agrees too.
            assert run["plain_differ"] == 0, run
    # The tokens are a function of the logits, seeds and positions: any rollout layout.
    for sampling in ("full", "per-row"):
        digests = {run["tokens_sha256"] for run in runs if run["sampling"] == sampling}
        assert len(digests) == 1, digests
    full = {run["tokens_sha256"] for run in runs if run["sampling"] == "full"}
    assert full != {run["tokens_sha256"] for run in runs if run["sampling"] == "per-row"}


def test_table_and_batch_key():
    p = run_cli("rollout", *SMALL)
    assert p.returncode == 0, p.stderr
    assert "vLLM TP 3" in p.stdout and "Megatron TP 2" in p.stdout
    assert "passed: no token's logprob differs" in p.stdout
    a = run_json("rollout", *SMALL, "--pairs", "3:1")["runs"][0]["tokens_sha256"]
    b = run_json("rollout", *SMALL, "--pairs", "3:1", "--batch-key", 7)["runs"][0]["tokens_sha256"]
    assert a != b


@pytest.mark.parametrize("pairs", ["3", "3:1,", "0:1", "3:x", "3:1:2", "65:1"])
def test_bad_pairs(pairs):
    p = run_cli("rollout", *SMALL, "--pairs", pairs)
    assert p.returncode == 2 and "--pairs" in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_bad_rows():
    p = run_cli("rollout", "--rows", 0)
    assert p.returncode == 2 and "--rows" in p.stderr
    p = run_cli("rollout", "--rows", 10**12)  # refused before anything is allocated
    assert p.returncode == 2 and "use fewer --rows" in p.stderr, p.stderr
