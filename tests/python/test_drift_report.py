"""python -m detlogp.drift_report: the planner, the rank and token layout, case validation, a
TP=1 report in this process, 4-process gloo TP2 x CP2 reports (passing, and failing on a
planted disagreement that names the rank), the launcher across topologies, and mpirun."""

import json
import shutil
import subprocess
import sys

import pytest

import detlogp
from detlogp import LogprobContractError
from detlogp import drift_report as dr

SMALL = dict(real_vocab=13, padded_vocab=16, num_vocab_tiles=8, batch=1, seq=4, prompt_tokens=1,
             batch_key=7)
TIMEOUT_S = 240


def small(tp=1, cp=1, **kw):
    return dr.DriftCase(tp=tp, cp=cp, **{**SMALL, **kw})


def test_planner_order_and_world_sizes():
    assert dr.PLANNED_TOPOLOGIES == ((1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2))
    assert [tp * cp for tp, cp in dr.PLANNED_TOPOLOGIES] == [1, 2, 2, 4, 4, 8]


def test_rank_map_of_tp2_cp2():
    layout = [dr.rank_layout(2, 2, r) for r in range(4)]
    assert [(cp, tp) for tp, cp, _ in layout] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [g for _, _, g in layout] == [(0, 1), (0, 1), (2, 3), (2, 3)]


def test_token_and_vocab_bounds_of_the_small_tp4_cp2_case():
    case = small(tp=4, cp=2)
    assert dr.token_bounds(case.tokens, case.cp) == [(0, 2), (2, 4)]
    assert case.vocab_bounds() == ((0, 4), (4, 8), (8, 12), (12, 16))
    assert dr.token_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]  # the first ranks take the extra
    with pytest.raises(LogprobContractError, match="cannot be split"):
        dr.token_bounds(1, 2)


def test_case_validation():
    with pytest.raises(LogprobContractError, match="explicit non-auto backend"):
        small(backend="auto")
    with pytest.raises(LogprobContractError, match="must divide"):
        small(padded_vocab=15)
    with pytest.raises(LogprobContractError, match="prompt_tokens"):
        small(prompt_tokens=5)
    with pytest.raises(LogprobContractError, match="at least tp"):
        small(tp=4, num_vocab_tiles=2, padded_vocab=16)
    with pytest.raises(LogprobContractError, match="must not be smaller"):
        small(padded_vocab=8)
    with pytest.raises(LogprobContractError, match="positive integer"):
        small(tp=0)
    assert small().case_id != small(batch_key=8).case_id and len(small().case_id) == 16


def test_launch_command_and_plan(tmp_path):
    case = small(tp=2, cp=2)
    cmd = dr.launch_command(case, "out.json")
    assert cmd.startswith("torchrun ")
    for part in ("--nproc_per_node=4", "--tp 2 --cp 2",
                 f"--backend {detlogp.CPU_CANONICAL_BACKEND_ID}",
                 "--real-vocab 13 --padded-vocab 16", "--output out.json"):
        assert part in cmd, part
    out = subprocess.run([sys.executable, "-m", "detlogp.drift_report", "--plan", "--output-dir",
                          str(tmp_path)] + sum(([f"--{k.replace('_', '-')}", str(v)]
                                                for k, v in SMALL.items()), []),
                         capture_output=True, text=True, timeout=60, env=dr._package_env())
    assert out.returncode == 0, out.stderr
    cmds = json.loads(out.stdout)["commands"]
    assert len(cmds) == 6
    assert all(f"tp{tp}-cp{cp}.json" in c and f"--nproc_per_node={tp * cp}" in c
               for c, (tp, cp) in zip(cmds, dr.PLANNED_TOPOLOGIES))


def test_world_size_mismatch_is_refused_before_any_process_group(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    # The launch, not the case: an environment error (RuntimeError, not a ValueError).
    with pytest.raises(RuntimeError, match="does not match TP\\*CP") as e:
        dr.run_topology(small(), None)
    assert not isinstance(e.value, ValueError)
    assert not dist.is_initialized()


def test_perturbation_from_the_environment(monkeypatch):
    monkeypatch.setenv(dr.PERTURB_ENV, "3:0.25")
    assert dr._perturbation(None) == (3, 0.25)
    assert dr._perturbation((1, 2.0)) == (1, 2.0)
    monkeypatch.setenv(dr.PERTURB_ENV, "oops")
    with pytest.raises(LogprobContractError, match="RANK:DELTA"):
        dr._perturbation(None)


def test_report_json_refuses_nan(tmp_path):
    with pytest.raises(ValueError):
        dr._write_json({"x": float("nan")}, str(tmp_path / "r.json"))
    assert not (tmp_path / "r.json").exists()  # no partial report either


@pytest.fixture(scope="module")
def tp1_report(tmp_path_factory):
    """The small case at TP=1, CP=1, in a process of its own (torchrun's environment)."""
    path = tmp_path_factory.mktemp("tp1") / "tp1-cp1.json"
    code, errs = dr.spawn_local(small(), path, timeout_s=TIMEOUT_S)
    assert code == 0, "".join(errs)
    text = path.read_text()
    return json.loads(text), text


def test_tp1_report_fields(tp1_report):
    r, text = tp1_report
    assert text.endswith("}\n") and json.loads(text) == r
    assert list(r) == sorted(r)  # sorted keys
    assert r["passed"] is True and r["failures"] == [] and r["schema_version"] == 1
    (rank,) = r["ranks"]
    assert rank["lse"]["count"] == 4 and rank["dlogp"]["count"] == 3
    assert rank["actual_backend"] == detlogp.CPU_CANONICAL_BACKEND_ID
    assert rank["fallback"] is False and rank["tp_outputs_bitwise_replicated"] is True
    assert rank["sp_world_size"] == 1 and rank["dp_world_size"] == 1
    assert rank["dlogp"]["worst_target_id"] is not None
    assert rank["shard_lse"]["passed"] is True and rank["perturbed"] is False
    assert len(rank["contract_fingerprint"]) == 64
    env = r["environment"]
    assert env["materialization"]["consistent"] is True and env["world_size"] == 1
    fp = r["bitwise_fingerprints"]
    assert len(fp["candidate_logp_sha256"]) == 64 and len(fp["candidate_lse_sha256"]) == 64
    assert fp["shape"] == [4] and fp["dtype"] == "float32"
    # The drift statistics are detlogp.drift()'s, over the active tokens against float64.
    assert r["aggregate"]["dlogp"]["count"] == 3 and r["aggregate"]["lse"]["count"] == 4
    assert r["aggregate"]["dlogp"]["thresholds"] == detlogp.drift_thresholds("bf16")


def test_gloo_tp2_cp2_report_passes_and_matches_tp1_bitwise(tmp_path, tp1_report):
    path = tmp_path / "tp2-cp2.json"
    code, errs = dr.spawn_local(small(tp=2, cp=2), path, timeout_s=TIMEOUT_S)
    assert code == 0, "".join(errs)
    r = json.loads(path.read_text())
    assert r["passed"] is True, r["failures"]
    assert [x["global_rank"] for x in r["ranks"]] == [0, 1, 2, 3]
    assert all(x["tp_outputs_bitwise_replicated"] for x in r["ranks"])
    assert r["environment"]["materialization"]["actual_backends"] == [
        detlogp.CPU_CANONICAL_BACKEND_ID]
    assert {x["cp_rank"] for x in r["ranks"]} == {0, 1}
    assert r["aggregate"]["dlogp"]["count"] == 3
    # One fingerprint for every rank of a TP group, and the whole batch equal to TP=1's bits.
    for cp in (0, 1):
        group = [x for x in r["ranks"] if x["cp_rank"] == cp]
        assert group[0]["output_sha256"] == group[1]["output_sha256"]
    assert r["bitwise_fingerprints"] == tp1_report[0]["bitwise_fingerprints"]
    assert len({x["contract_fingerprint"] for x in r["ranks"]}) == 2  # one per CP token slice


def test_planted_disagreement_fails_and_names_the_rank(tmp_path):
    path = tmp_path / "tp2-cp2.json"
    code, errs = dr.spawn_local(small(tp=2, cp=2, seq=8), path, perturb=(1, 1.0),
                                timeout_s=TIMEOUT_S)
    assert code == 1, "".join(errs)
    r = json.loads(path.read_text())
    assert r["passed"] is False
    assert r["disagreeing_shard_ranks"] == [1]  # the rank whose logits were changed
    assert 1 in r["failed_ranks"] and not {2, 3} & set(r["failed_ranks"])  # other CP slice ok
    by_rank = {x["global_rank"]: x for x in r["ranks"]}
    assert by_rank[1]["perturbed"] and not by_rank[1]["shard_lse"]["passed"]
    assert by_rank[0]["shard_lse"]["passed"]
    assert any(f.startswith("rank 1 (tp_rank 1, cp_rank 0): its logits shard [8, 16) "
                            "disagrees") for f in r["failures"])
    assert by_rank[1]["tp_outputs_bitwise_replicated"]  # the op still agrees with itself


def test_launcher_runs_topologies_and_compares_their_bits(tmp_path):
    assert dr.launch(small(), tmp_path, ((1, 1), (2, 1)), timeout_s=TIMEOUT_S)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["passed"] and summary["cross_topology_bitwise"]
    assert [(t["tp"], t["cp"], t["exit_code"]) for t in summary["topologies"]] == [
        (1, 1, 0), (2, 1, 0)]
    assert (tmp_path / "tp2-cp1.json").exists()


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun")
def test_mpirun_launch_of_tp2_cp2(tmp_path):
    assert dr.launch(small(), tmp_path, ((2, 2),), launcher="mpirun", timeout_s=TIMEOUT_S), (
        (tmp_path / "summary.json").read_text())
    r = json.loads((tmp_path / "tp2-cp2.json").read_text())
    assert r["passed"] and len(r["ranks"]) == 4
