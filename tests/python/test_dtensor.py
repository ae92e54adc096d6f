"""DTensor inputs over gloo (spawned ranks): DTensor logits sharded on the vocabulary (Shard(-1))
on a 1-D TP mesh (TP=2; TP=3 with DTensor's uneven split) and on a DP=2 x TP=2 mesh; the fused
lm_head's DTensor weight (Shard(0)) on the TP (sub-)mesh. Outputs are DTensors Replicate on the
TP dim, bitwise equal to the plain-tensor call and to TP=1; the gradient is a DTensor with the
input's placements. torch's own loss_parallel cross entropy changes bits with the TP degree."""

import pytest
import torch

pytest.importorskip("torch.distributed.tensor", reason="DTensor needs torch >= 2.4")

from helpers import assert_bitwise  # noqa: E402
from spawn import run_workers  # noqa: E402

TIMEOUT_S = 300
TOPOLOGIES = {"tp2": 2, "tp3": 3, "dp2xtp2": 4}
DTYPES = ["torch.float32", "torch.bfloat16"]


@pytest.fixture(scope="module", params=list(TOPOLOGIES))
def topology(request, tmp_path_factory):
    import dtensor_worker

    name = request.param
    ranks = run_workers(dtensor_worker.main, tmp_path_factory.mktemp(name), TOPOLOGIES[name],
                        TIMEOUT_S, name)[0]
    return name, ranks


def _tp(name, rank):
    """(TP degree, TP rank, DP rank) of ``rank`` on the mesh ``name`` (DP-major)."""
    if name == "dp2xtp2":
        return 2, rank % 2, rank // 2
    return TOPOLOGIES[name], rank, 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["dtensor-targets=False", "dtensor-targets=True", "sub-mesh"])
def test_dtensor_logits_bitwise_equal_to_plain_call_and_tp1(topology, dtype, case):
    name, ranks = topology
    if case == "sub-mesh" and name != "dp2xtp2":
        pytest.skip("the TP sub-mesh of the DP x TP mesh")
    two_d = name == "dp2xtp2" and case != "sub-mesh"
    for rank, res in enumerate(ranks):
        got = res[f"logprobs {dtype} {case}"]
        what = f"{name} {case} rank {rank}"
        # DTensor's own split of the vocabulary is torch.chunk's (uneven at TP=3).
        assert got["columns"] == got["table"][_tp(name, rank)[1]], what
        for out in ("logp", "entropy"):
            assert_bitwise(got[out], got[f"plain_{out}"], f"{out} vs plain, {what}")
            assert_bitwise(got[out], got[f"ref_{out}"], f"{out} vs TP=1, {what}")
        assert_bitwise(got["grad"], got["plain_grad"], f"grad vs plain, {what}")
        assert_bitwise(got["grad"], got["ref_grad"], f"grad vs TP=1, {what}")
        # The drop-ins take the DTensor too (the group from the mesh, even verl's one-rank one).
        assert_bitwise(got["cross_entropy"], -got["unmasked_logp"], f"cross entropy, {what}")
        assert_bitwise(got["verl_tp"], got["unmasked_logp"], f"verl TP drop-in, {what}")
        assert_bitwise(got["verl"], got["unmasked_logp"], f"verl drop-in, {what}")
        # softcap= and per-token temperature= reach the plain call, and change the result.
        assert_bitwise(got["capped"], got["plain_capped"], f"softcap + temperature, {what}")
        assert not torch.equal(got["capped"], got["unmasked_logp"]), what
        # kept_ids= (a DTensor laid out as the targets, or the plain local tensor) too.
        assert_bitwise(got["kept"], got["plain_kept"], f"kept sets, {what}")
        assert not torch.equal(got["kept"], got["unmasked_logp"]), what
        # DTensors out, Replicate on the TP dim; the gradient keeps the input's placements.
        assert got["outputs"] == ["DTensor", "DTensor"] and got["grad_type"] == "DTensor"
        want = ["Shard(dim=0)", "Replicate()"] if two_d else ["Replicate()"]
        assert got["placements"] == want, what
        assert got["grad_placements"] == got["input_placements"], what
        assert got["global_shape"] == ((2, 9) if case == "sub-mesh" else (4, 9)), what
    if name == "tp3":
        assert [tuple(b) for b in ranks[0][f"logprobs {dtype} {case}"]["table"]] == [
            (0, 384), (384, 768), (768, 1150)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_dtensor_weight_bitwise_equal_to_tp1(topology, dtype):
    name, ranks = topology
    for rank, res in enumerate(ranks):
        got, what = res[f"fused {dtype}"], f"{name} rank {rank}"
        for out in ("logp", "lse", "grad_weight", "grad_hidden"):
            assert_bitwise(got[out], got[f"ref_{out}"], f"{out}, {what}")
        assert got["placements"] == ["Replicate()"], what
        assert got["grad_weight_placements"] == ["Shard(dim=0)"], what
        assert got["grad_hidden_placements"] == ["Replicate()"], what


def test_torch_loss_parallel_changes_bits_with_tp_detlogp_does_not(topology):
    name, ranks = topology
    if name != "tp2":
        pytest.skip("run on the TP=2 mesh")
    for rank, res in enumerate(ranks):
        got = res["loss_parallel"]
        # Both compute the same loss: torch's TP=2 and TP=1 agree to rounding...
        torch.testing.assert_close(got["torch_tp"], got["torch_tp1"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["detlogp_tp"], got["torch_tp1"], rtol=1e-5, atol=1e-5)
        # ... but torch's bits move with the TP degree on some tokens, detlogp's on none.
        differ = int((got["torch_tp"] != got["torch_tp1"]).sum())
        assert differ > 0, f"rank {rank}: torch's TP=2 bits equal TP=1 on every token"
        assert_bitwise(got["detlogp_tp"], got["detlogp_tp1"], f"detlogp, rank {rank}")
        print(f"loss_parallel: {differ} of {got['torch_tp'].numel()} tokens differ at TP=2")


def test_replicated_dtensor_logits_are_the_whole_vocabulary(topology):
    name, ranks = topology
    if name != "tp2":
        pytest.skip("run on the TP=2 mesh")
    for rank, res in enumerate(ranks):
        assert res["replicated"]["placements"] == ["Replicate()"]
        assert_bitwise(res["replicated"]["logp"], res["replicated"]["ref"], f"rank {rank}")


def test_softcap_reaches_the_call_on_dtensor_logits(topology):
    name, ranks = topology
    if name != "tp2":
        pytest.skip("run on the TP=2 mesh")
    for rank, res in enumerate(ranks):
        got = res["softcap"]
        assert_bitwise(got["logp"], got["plain_logp"], f"logp, rank {rank}")
        assert_bitwise(got["grad"], got["plain_grad"], f"grad, rank {rank}")
        assert not torch.equal(got["logp"], got["uncapped"]), f"rank {rank}: cap ignored"


def test_dtensor_misuse_fails_with_the_fix_and_any_split_works(topology):
    name, ranks = topology
    if name != "tp2":
        pytest.skip("run on the TP=2 mesh")
    wrong = [res["wrong local shard"] for res in ranks]
    assert "local shard has 600 vocab columns" in wrong[1]["message"], wrong[1]
    assert "columns [512, 1024)" in wrong[1]["message"], wrong[1]
    assert "cross-rank preflight failed" in wrong[0]["message"], wrong[0]
    assert "600 vocab columns" in wrong[0]["message"], wrong[0]  # the peer's own reason
    assert all(w["seconds"] < 20 for w in wrong), wrong  # nobody waited for a timeout
    for res in ranks:
        assert "LogprobContractError" in res["group given"]["message"]
        assert "drop group=" in res["group given"]["message"]
        assert "Partial" in res["partial"]["message"]
        assert "redistribute" in res["partial"]["message"]
        assert "logits is not" in res["plain logits, DTensor targets"]["message"]
        off = res["off the tiles"]
        assert_bitwise(off["logp"], off["one rank"], "DTensor split off the tiles")
