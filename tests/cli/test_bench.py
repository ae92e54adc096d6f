"""detlogp bench, tiny sizes: every benchmark runs, the JSON schema, sane numbers."""

import json

from cli_helpers import run_cli

NAMES = ["canonical_forward", "canonical_forward_entropy", "canonical_backward",
         "naive_forward", "nondeterministic_forward"]


def test_bench_json():
    p = run_cli("bench", "--tokens", 16, "--real-vocab", 4000, "--repeats", 1, "--threads", 2,
                "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["machine"]["read_gbps"] > 0
    assert [x["name"] for x in r["results"]] == NAMES
    for x in r["results"]:
        assert x["dtype"] == "bf16" and x["tokens"] == 16 and x["vocab"] == 4096
        assert x["seconds_median"] > 0
        assert x["elements_per_second"] == __import__("pytest").approx(16 * 4096 /
                                                                        x["seconds_median"])
        assert x["floor_fraction"] > 0


def test_bench_table_fp32():
    p = run_cli("bench", "--tokens", 8, "--real-vocab", 2000, "--repeats", 1, "--dtype", "fp32")
    assert p.returncode == 0, p.stderr
    for name in NAMES:
        assert name in p.stdout
    assert "read bandwidth" in p.stdout
