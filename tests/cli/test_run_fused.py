"""detlogp run --fused (the fused lm_head on the in-process rank group), small sizes: exit 0,
every bitwise check passed, digests equal across TP degrees, every dtype."""

import pytest

from cli_helpers import run_cli, run_json

SMALL = ["--fused", "--tokens", 5, "--hidden", 72, "--real-vocab", 3000, "--threads", 2]


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_fused_digests_equal_across_tp(dtype):
    r = run_json("run", *SMALL, "--dtype", dtype, "--tp", "1,2,3,4,8", "--tile-width", 64)
    assert r["checks"]["passed"] and r["checks"]["fused_equals_reference"]
    runs = r["runs"]
    assert [run["tp"] for run in runs] == [1, 2, 3, 4, 8]
    for run in runs:
        assert run["digests"] == runs[0]["digests"], run["tp"]
        assert run["forward_seconds"] > 0 and run["backward_seconds"] > 0


def test_fused_table_prints_the_checks():
    p = run_cli("run", *SMALL, "--tp", "1,2")
    assert p.returncode == 0, p.stderr
    assert "fused == linear_logits + operator (logp, lse, entropy): yes" in p.stdout
    assert "grad_hidden bitwise equal on every rank of every TP degree: yes" in p.stdout


def test_fused_rejects_bad_sizes():
    p = run_cli("run", "--fused", "--hidden", 0)
    assert p.returncode == 2 and "--hidden" in p.stderr
