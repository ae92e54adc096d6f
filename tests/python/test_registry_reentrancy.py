"""Backend factories may call their registry back (from Python too, on a fresh registry and on
the process-wide one), and a Backend.cpu backend cannot declare more than its kernels compute."""

import pytest

from detlogp import Backend, LogprobBackendCapability, LogprobContractError, Registry
from test_registry import full_cap, qwen_tp2

REENTRANT_SCRIPT = r"""
import detlogp
from test_registry import full_cap, qwen_tp2


class PyOp:
    def forward(self, *a, **k): pass
    def backward(self, *a, **k): pass


for reg in (detlogp.Registry(), detlogp.Registry.default()):
    seen = {}

    def factory(reg=reg, seen=seen):
        seen["candidates"] = reg.contract_candidates("cpu")
        seen["failed"] = reg.failed_to_load("REENTRANT")
        reg.register_logprob_backend(detlogp.Backend.cpu("LATE", "late", kernels="reference"),
                                     full_cap("late", "reference"))
        return PyOp()

    reg.register_logprob_backend(detlogp.Backend("REENTRANT", factory),
                                 full_cap("reentrant", "reference"), prepend=True)
    op, provenance = reg.get_logprob_op(qwen_tp2())
    assert isinstance(op, PyOp), op
    assert seen["candidates"][0] == "REENTRANT" and seen["failed"] is False, seen
    assert not reg.failed_to_load("REENTRANT")
    assert "LATE" in reg.contract_candidates("cpu")
    reg.get_logprob_op(qwen_tp2(), "late")  # dispatch still gets through
print("no deadlock")
"""


def test_a_factory_may_call_its_registry_back():
    """In a child process: a deadlock there is a timeout here, not a hung test run."""
    from helpers import run_child_script

    proc = run_child_script(REENTRANT_SCRIPT)
    assert proc.returncode == 0 and "no deadlock" in proc.stdout, proc.stdout + proc.stderr


def test_batch_invariant_kernels_cannot_claim_cross_tp_bitwise():
    reg = Registry()
    cap = LogprobBackendCapability(
        backend_id="bi", roles=("train", "infer"), dtypes=("fp32",), tp_world_sizes=(1,),
        mask_modes=("ignore_index",), determinism_scopes=("cross_tp_bitwise",),
        reduction_orders=("global_vocab_shard_index",))
    with pytest.raises(LogprobContractError,
                       match="its kernels provide determinism_scopes=\\[fixed_topology\\]") as e:
        reg.register_logprob_backend(Backend.cpu("BI", "bi", kernels="batch_invariant"), cap)
    assert (e.value.code, e.value.field) == ("not_supported", "capability.determinism_scopes")
    assert reg.contract_candidates("cpu") == []
    # The canonical kernels do provide it.
    reg.register_logprob_backend(Backend.cpu("REF", "ref", kernels="reference"),
                                 full_cap("ref", "reference"))
    assert reg.get_logprob_op(qwen_tp2()).actual_backend == "ref"
