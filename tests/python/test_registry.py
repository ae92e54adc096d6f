"""Backend registration and dispatch from Python (detlogp.Registry over the C++ registry).

The first twelve tests mirror tests/unit/registry/registry_test.cpp one for one (same names in
snake case, same scenarios); the rest cover what only Python has: Python-defined backends, the
default registry and argument checks."""

import json
import threading

import numpy as np
import pytest
import torch

import detlogp
from detlogp import (Backend, LogprobBackendCapability, LogprobContractError, MaskSpec, Registry,
                     ReductionSpec, ShardingSpec)
from helpers import assert_bitwise, contract

ROLES = ("train", "infer")
DTYPES = ("bf16", "fp16", "fp32")


def qwen_tp2(scope="cross_tp_bitwise", cp=1):
    """Qwen3-8B TP=2 bf16, rank 0, with the given determinism scope."""
    sh = ShardingSpec(tp_rank=0, tp_world_size=2, vocab_shard_bounds=[(0, 76032), (76032, 152064)],
                      real_vocab_size=151936, padded_vocab_size=152064, cp_world_size=cp)
    mask = MaskSpec(8, [False, False, True, True, True, True, True, False])
    return detlogp.LogprobContract(role="train", dtype="bf16", mask=mask, sharding=sh,
                                   reduction=ReductionSpec(determinism_scope=scope))


def tp1(real, padded, all_active=True):
    sh = ShardingSpec(tp_rank=0, tp_world_size=1, vocab_shard_bounds=[(0, padded)],
                      real_vocab_size=real, padded_vocab_size=padded)
    mask = MaskSpec.all_active(4) if all_active else MaskSpec(4, [True, False, True, True])
    return detlogp.LogprobContract(role="train", dtype="fp32", mask=mask, sharding=sh)


def single_shard_cap(backend_id, kind):
    return LogprobBackendCapability(backend_id=backend_id, roles=ROLES, dtypes=DTYPES,
                                    tp_world_sizes=(1,), mask_modes=("ignore_index",),
                                    determinism_scopes=("fixed_topology",),
                                    implementation_kind=kind)


def full_cap(backend_id, kind):
    return LogprobBackendCapability(
        backend_id=backend_id, roles=ROLES, dtypes=DTYPES, supports_vocab_padding=True,
        mask_modes=("explicit_active_mask", "ignore_index"), exports_vocab_lse=True,
        determinism_scopes=("cross_tp_bitwise", "fixed_topology"), implementation_kind=kind)


def reference_backend(name, backend_id):
    return Backend.cpu(name, backend_id, kernels="reference")


def register_reference(reg, name, backend_id, cap=full_cap, kind="reference"):
    """Registers the reference-kernels backend `name` with the capability cap(backend_id, kind)."""
    reg.register_logprob_backend(reference_backend(name, backend_id), cap(backend_id, kind))


def dispatch_error(reg, c, req="auto"):
    with pytest.raises(RuntimeError) as info:
        reg.get_logprob_op(c, req)
    return str(info.value)


# --- the C++ registry tests, one for one -------------------------------------------------------


def test_single_shard_only_rejects_tp2_contract_with_every_reason():
    r = Registry()
    register_reference(r, "SINGLE_A", "single-a", cap=single_shard_cap, kind="production")
    msg = dispatch_error(r, qwen_tp2())
    assert "TP=2 is unsupported" in msg
    assert "vocab-domain LSE export is unsupported" in msg
    assert "determinism_scope=cross_tp_bitwise is unsupported" in msg
    assert "padded-vs-real vocab masking is unsupported" in msg
    assert "No logprob backend supports" in msg
    # A padded TP=1 contract: the padding reason, not the TP reason.
    msg1 = dispatch_error(r, tp1(27, 32))
    assert "TP=1 is unsupported" not in msg1
    assert "padded-vs-real vocab masking is unsupported" in msg1


def test_reference_policy_skips_single_shard_with_fallback_and_reasons():
    r = Registry()
    register_reference(r, "SINGLE_REF", "single-ref", cap=single_shard_cap)
    register_reference(r, "VP_REF", "vp-ref")
    d = r.get_logprob_op(qwen_tp2(), "reference")
    assert d.actual_backend == "vp-ref"
    assert d.fallback is True
    assert len(d.prior_rejections) == 1
    assert "vocab-domain LSE export is unsupported" in d.prior_rejections[0]
    # Default policy auto resolves the reference-kind backend too, provenance says "auto".
    a = r.get_logprob_op(qwen_tp2())
    assert a.actual_backend == "vp-ref"
    assert a.provenance["requested_backend"] == "auto"


def test_candidate_without_capability_is_rejected_as_fallback():
    r = Registry()
    r.add_contract_candidate(reference_backend("NATIVE", "native"))
    assert "NATIVE: no LogprobBackendCapability declared" in dispatch_error(r, qwen_tp2())
    register_reference(r, "VP_REF", "vp-ref")
    d = r.get_logprob_op(qwen_tp2(), "reference")
    assert d.fallback is True  # a missing capability always counts, even before the policy


def test_provenance_of_a_compatible_backend():
    r = Registry()
    register_reference(r, "TEST_TP", "test-deterministic-tp-logprob")
    d = r.get_logprob_op(qwen_tp2(), "reference")
    assert d.fallback is False
    j = json.loads(json.dumps(d.provenance))  # JSON-serializable
    assert j["requested_backend"] == "reference"
    assert j["actual_backend"] == "test-deterministic-tp-logprob"
    assert j["backend_enum"] == "TEST_TP"
    assert j["platform"] == "cpu"
    assert j["fallback"] is False
    assert j["contract"]["sharding"]["tp_world_size"] == 2
    assert j["contract"]["sharding"]["real_vocab_size"] == 151936
    assert j["contract"]["reduction"]["cp_is_merge_axis"] is False
    assert j["capability"]["backend_id"] == "test-deterministic-tp-logprob"
    assert j["numerics_version"] == detlogp.NUMERICS_VERSION
    assert j["kernel"] == "scalar-reference"
    assert isinstance(j["prior_rejections"], list)
    # Exact ids: case-sensitive; policies: case-insensitive.
    assert ("does not match requested_backend=another-backend"
            in dispatch_error(r, qwen_tp2(), "another-backend"))
    assert (r.get_logprob_op(qwen_tp2(), "test-deterministic-tp-logprob").actual_backend
            == "test-deterministic-tp-logprob")
    assert r.get_logprob_op(qwen_tp2(), "REFERENCE").requested_backend == "REFERENCE"
    dispatch_error(r, qwen_tp2(), "Test-Deterministic-TP-Logprob")
    assert r.get_logprob_op(qwen_tp2(), "  reference  ").requested_backend == "reference"


def test_policy_skip_is_not_a_fallback_but_capability_skip_is():
    r = Registry()
    register_reference(r, "OTHER", "other-id")
    register_reference(r, "WANTED", "wanted-id")
    d = r.get_logprob_op(qwen_tp2(), "wanted-id")
    assert d.fallback is False
    assert len(d.prior_rejections) == 1

    r2 = Registry()
    r2.register_logprob_backend(
        reference_backend("TP1_ONLY", "tp1-only"),
        LogprobBackendCapability(backend_id="tp1-only", roles=ROLES, dtypes=DTYPES,
                                 tp_world_sizes=(1,), supports_vocab_padding=True,
                                 mask_modes=("explicit_active_mask",), exports_vocab_lse=True,
                                 determinism_scopes=("cross_tp_bitwise",),
                                 implementation_kind="reference"))
    register_reference(r2, "ANY", "any-tp")
    d2 = r2.get_logprob_op(qwen_tp2())
    assert d2.fallback is True
    assert d2.prior_rejections
    assert "TP=2 is unsupported" in d2.prior_rejections[0]


def test_request_validation():
    r = Registry()
    with pytest.raises(LogprobContractError, match="determinism_scope"):
        r.get_logprob_op(qwen_tp2(), "deterministic")
    with pytest.raises(LogprobContractError):
        r.get_logprob_op(qwen_tp2(), "   ")
    assert "no candidates registered" in dispatch_error(r, qwen_tp2())


def test_registration_replaces_scopes_per_platform_and_rejects_unknown_platforms():
    r = Registry()
    b = reference_backend("VP", "vp")
    r.register_logprob_backend(b, single_shard_cap("vp", "reference"))
    r.register_logprob_backend(b, full_cap("vp", "reference"), platform="cpu", prepend=True)
    assert r.contract_candidates("cpu") == ["VP"]
    assert r.capability("cpu", "VP").exports_vocab_lse is True
    assert r.capability("cuda", "VP") is None
    assert r.contract_candidates("cuda") == []
    with pytest.raises(LogprobContractError, match="unsupported platform"):
        r.register_logprob_backend(b, full_cap("vp", "reference"), platform="cuda-typo")
    with pytest.raises(LogprobContractError, match="capability must be"):
        r.register_logprob_backend(b, None)
    # Stripped ids: the capability stores "padded-id".
    r.register_logprob_backend(reference_backend("PADDED", "x"),
                               full_cap("  padded-id  ", "reference"))
    assert r.capability("cpu", "PADDED").backend_id == "padded-id"


def test_fixed_topology_only_capability():
    r = Registry()
    cap = LogprobBackendCapability(backend_id="fixed", roles=ROLES, dtypes=DTYPES,
                                   supports_vocab_padding=True,
                                   mask_modes=("explicit_active_mask",), exports_vocab_lse=True,
                                   determinism_scopes=("fixed_topology",),
                                   implementation_kind="reference")
    r.register_logprob_backend(reference_backend("FIXED", "fixed"), cap)
    assert "determinism_scope=cross_tp_bitwise is unsupported" in dispatch_error(r, qwen_tp2())
    assert r.get_logprob_op(qwen_tp2("fixed_topology")).actual_backend == "fixed"


def test_legacy_lists_are_decoupled_and_share_the_cache_and_blacklist():
    r = Registry()
    broken_calls = []

    def broken():
        broken_calls.append(1)
        raise RuntimeError("native library missing")

    broken_backend = Backend("BROKEN", broken)
    good = reference_backend("GOOD", "good")
    r.register_legacy_backend("logprob", broken_backend)
    r.register_legacy_backend("logprob", good)
    assert r.contract_candidates("cpu") == []  # legacy never feeds the contract list
    r.register_logprob_backend(broken_backend, full_cap("broken", "production"))
    r.register_logprob_backend(good, full_cap("good", "reference"))
    assert r.legacy_priority("logprob", "cpu") == ["BROKEN", "GOOD"]
    # Contract dispatch: BROKEN fails to load, is recorded, GOOD serves with fallback.
    d = r.get_logprob_op(qwen_tp2())
    assert d.actual_backend == "good"
    assert d.fallback is True
    assert "BROKEN: backend could not be loaded or instantiated" in d.prior_rejections[0]
    assert r.failed_to_load("BROKEN")
    # Legacy path: the blacklist is shared, the factory is never called again, the cache too.
    op = r.get_op("logprob")
    assert op._cpp is d.op._cpp
    assert len(broken_calls) == 1
    with pytest.raises(RuntimeError, match="No functional backend found for unknown_op on cpu"):
        r.get_op("unknown_op")


def test_the_fused_lm_head_has_its_own_candidate_list():
    from detlogp._registry import OP_KINDS
    assert OP_KINDS == ("logits", "fused_linear")
    r = Registry.with_builtin_backends()
    assert r.contract_candidates("cpu", op_kind="fused_linear") == [
        "CPU_FUSED_LINEAR_LOGP", "CPU_FUSED_LINEAR_REFERENCE_LOGP"]
    assert r.contract_candidates("cuda", op_kind="fused_linear") == []
    assert r.contract_candidates("cpu", "logits") == r.contract_candidates("cpu")
    cap = r.capability("cpu", "CPU_FUSED_LINEAR_REFERENCE_LOGP")
    assert cap.backend_id == "cpu-fused-linear-reference-logp"
    assert cap.implementation_kind == "reference"
    with pytest.raises(LogprobContractError, match="op_kind must be one of: logits, fused_linear"):
        r.contract_candidates("cpu", "fused")


def test_builtin_backends_order_and_truthful_capabilities():
    r = Registry.with_builtin_backends()
    assert r.contract_candidates("cpu") == [
        "CPU_CANONICAL_VOCAB_PARALLEL_LOGP", "CPU_REFERENCE_VOCAB_PARALLEL_LOGP",
        "CPU_BATCH_INVARIANT_LOGP"]
    assert r.contract_candidates("cuda") == []
    # The reference never appears in a legacy list.
    assert r.legacy_priority("batch_invariant_logp", "cpu") == ["CPU_BATCH_INVARIANT_LOGP"]
    prod = r.get_logprob_op(qwen_tp2())
    assert prod.actual_backend == detlogp.CPU_CANONICAL_BACKEND_ID
    assert prod.fallback is False
    assert "highway:" in prod.provenance["kernel"]
    ref = r.get_logprob_op(qwen_tp2(), "reference")
    assert ref.actual_backend == detlogp.CPU_REFERENCE_BACKEND_ID
    assert ref.fallback is False
    assert (r.get_logprob_op(qwen_tp2(), detlogp.CPU_REFERENCE_BACKEND_ID).actual_backend
            == detlogp.CPU_REFERENCE_BACKEND_ID)
    assert ref.provenance["contract"]["reduction"]["determinism_scope"] == "cross_tp_bitwise"
    # The single-shard backend serves nothing vocab-parallel: asking for it lists its reasons.
    assert ("vocab-domain LSE export is unsupported"
            in dispatch_error(r, qwen_tp2(), detlogp.CPU_BATCH_INVARIANT_BACKEND_ID))


@pytest.mark.parametrize("dtype", DTYPES)
def test_production_equals_reference_bitwise(dtype):
    """The canon promises identical bits from both CPU backends; shown through the registry."""
    real, padded, rows = 1000, 1024, 9
    r = Registry.with_builtin_backends()
    bounds = [(0, 384), (384, 1024)]
    g = torch.Generator().manual_seed(77)
    x = (torch.randn(rows, padded, generator=g) * 3).to(
        {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype])
    t = torch.tensor([(i * 97) % real for i in range(rows)])
    active = [True, True, False, True, True, True, True, False, True]
    cs = [contract(rows, real, padded, bounds=bounds, rank=k, dtype=dtype, mask=active,
                   tile_width=64, temperature=0.7) for k in range(2)]
    prod = r.get_logprob_op(cs[0], "production").op
    ref = r.get_logprob_op(cs[0], "reference").op
    outs = []
    for op in (prod, ref):
        shards = [x[:, s:e] for s, e in bounds]
        outs.append(detlogp._detlogp.in_process_forward(
            op=op._cpp, dtype=dtype,
            shards=[(s.data_ptr(), s.shape[0], s.shape[1], s.stride(0)) for s in shards],
            contracts=[c._cpp for c in cs], targets=t.numpy(), deterministic=True, entropy=True))
    for (a, b) in zip(outs[0], outs[1]):
        for k, what in enumerate(("logp", "lse", "entropy")):
            assert_bitwise(a[k], b[k], what)
    # Gradients (one rank holding the whole vocabulary): the same bits from both backends.
    c1 = contract(rows, real, padded, dtype=dtype, mask=active, tile_width=64, temperature=0.7)
    grads = []
    for policy in ("production", "reference"):
        op = r.get_logprob_op(c1, policy).op
        xg = x.clone().requires_grad_(True)
        logp, lse, ent = op(xg, t, contract=c1, entropy=True)
        (0.5 * logp.sum() - 0.25 * lse.sum() + 0.125 * ent.sum()).backward()
        grads.append(xg.grad[:, :real])
    assert_bitwise(grads[0], grads[1], "grad")


def test_concurrent_dispatch_and_registration():
    r = Registry.with_builtin_backends()
    c = qwen_tp2()
    ok = []
    errors = []

    def work(t):
        try:
            for i in range(50):
                if t == 0 and i % 10 == 0:
                    r.register_logprob_backend(reference_backend(f"EXTRA_{i}", "extra"),
                                               full_cap("extra", "reference"))
                d = r.get_logprob_op(c, "auto" if i % 2 else "reference")
                ok.append(d.op is not None)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert ok.count(True) == 8 * 50
    # One instance per backend, whatever the concurrency.
    a, b = r.get_logprob_op(c), r.get_logprob_op(c)
    assert a.op._cpp is b.op._cpp


# --- Python only -------------------------------------------------------------------------------


class TorchLogSoftmaxOp:
    """A Python-defined backend: logp and LSE by torch.log_softmax over the real vocabulary
    (TP=1 only, as its capability says)."""

    backend_id = "py-log-softmax"
    kernel_name = "torch.log_softmax"

    def __init__(self):
        self.calls = 0

    def forward(self, local_logits, target_ids, *, contract, group=None):
        self.calls += 1
        z = local_logits.float()[:, :contract.sharding.real_vocab_size]
        lse = torch.logsumexp(z, dim=-1)
        active = torch.tensor(contract.mask.active_mask)
        safe = torch.where(active, target_ids, torch.zeros_like(target_ids))
        logp = torch.where(active, z.gather(1, safe[:, None])[:, 0] - lse, torch.zeros_like(lse))
        return logp, lse

    def backward(self, *args, **kwargs):
        raise NotImplementedError("autograd differentiates forward")

    __call__ = forward


def py_cap(tp=(1,)):
    return LogprobBackendCapability(
        backend_id=TorchLogSoftmaxOp.backend_id, roles=ROLES, dtypes=DTYPES, tp_world_sizes=tp,
        supports_vocab_padding=True, mask_modes=("explicit_active_mask", "ignore_index"),
        exports_vocab_lse=True, determinism_scopes=("fixed_topology",),
        implementation_kind="production", reduction_orders=("global_vocab_shard_index",))


def py_contract(n=5, real=27, padded=32):
    return detlogp.LogprobContract(
        role="train", dtype="fp32", mask=MaskSpec(n, [True, True, False, True, True]),
        sharding=ShardingSpec(tp_rank=0, tp_world_size=1, vocab_shard_bounds=[(0, padded)],
                              real_vocab_size=real, padded_vocab_size=padded),
        reduction=ReductionSpec(order="global_vocab_shard_index",
                                determinism_scope="fixed_topology"))


def test_python_defined_backend_dispatches_and_runs():
    made = []

    def factory():
        made.append(TorchLogSoftmaxOp())
        return made[-1]

    r = Registry.with_builtin_backends()
    r.register_logprob_backend(Backend("PY_LOG_SOFTMAX", factory), py_cap(), prepend=True)
    assert r.contract_candidates("cpu")[0] == "PY_LOG_SOFTMAX"
    c = py_contract()
    d = r.get_logprob_op(c)
    op, prov = d
    assert op is made[0] and len(made) == 1  # the factory's own object, made once
    assert d.actual_backend == "py-log-softmax" and d.fallback is False
    assert prov["backend_enum"] == "PY_LOG_SOFTMAX"
    assert prov["kernel"] == "torch.log_softmax"
    assert r.get_logprob_op(c).op is op  # cached like any backend
    # It serves: against detlogp's reference backend on the same logits, within fp32 tolerance.
    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, 32, generator=g)
    t = torch.tensor([1, 5, -100, 26, 13])
    logp, lse = op(x, t, contract=c)
    ref_c = c.replace(reduction=ReductionSpec(determinism_scope="fixed_topology"))
    ref_op = r.get_logprob_op(ref_c, "reference").op
    rlogp, rlse = ref_op(x, t, contract=ref_c)
    assert torch.allclose(logp, rlogp, atol=1e-5, rtol=0)
    assert torch.allclose(lse, rlse, atol=1e-5, rtol=0)
    assert logp[2].item() == 0.0
    # A TP=2 contract is outside its capability: the registry says so, it is never called.
    c2 = qwen_tp2("fixed_topology")
    d2 = r.get_logprob_op(c2)
    assert d2.actual_backend == detlogp.CPU_CANONICAL_BACKEND_ID and d2.fallback is True
    assert "PY_LOG_SOFTMAX: TP=2 is unsupported" in d2.prior_rejections[0]


def test_python_factories_that_cannot_serve_are_load_failures():
    calls = []

    def returns_none():
        calls.append("none")

    def not_an_op():
        calls.append("object")
        return object()

    r = Registry()
    r.register_logprob_backend(Backend("NONE", returns_none), full_cap("none", "production"))
    r.register_logprob_backend(Backend("NOT_AN_OP", not_an_op), full_cap("obj", "production"))
    register_reference(r, "REF", "ref")
    d = r.get_logprob_op(qwen_tp2())
    assert d.actual_backend == "ref" and d.fallback is True
    assert [p.split(":")[0] for p in d.prior_rejections] == ["NONE", "NOT_AN_OP"]
    assert all("could not be loaded or instantiated" in p for p in d.prior_rejections)
    r.get_logprob_op(qwen_tp2())
    assert calls == ["none", "object"]  # blacklisted: never called again


def test_default_registry_serves_python_backends_to_get_logprob_op():
    # The process-wide registry outlives this test: the capability is narrowed to a tile width
    # no other test uses, so that no other contract ever dispatches to it.
    name = "PY_DEFAULT_TEST_BACKEND"
    cap = py_cap().replace(backend_id="py-default-test-backend", tile_widths=(7,))
    detlogp.register_logprob_backend(Backend(name, TorchLogSoftmaxOp), cap)  # appended: last
    c = py_contract(padded=28).replace(tile_width=7)
    canon_order = c.replace(reduction=ReductionSpec(determinism_scope="fixed_topology"))
    assert detlogp.get_logprob_op(canon_order).actual_backend == detlogp.CPU_CANONICAL_BACKEND_ID
    d = detlogp.get_logprob_op(c, "py-default-test-backend")
    assert isinstance(d.op, TorchLogSoftmaxOp)
    assert Registry.default().get_logprob_op(c, "py-default-test-backend").op is d.op
    assert name in Registry.default().contract_candidates("cpu")


def test_argument_checks_and_legacy_get_op_by_device():
    r = Registry()
    with pytest.raises(LogprobContractError, match="backend must be a Backend"):
        r.register_logprob_backend("CPU_REFERENCE", full_cap("x", "reference"))
    with pytest.raises(LogprobContractError, match="capability must be a "
                                                   "LogprobBackendCapability"):
        r.register_logprob_backend(reference_backend("A", "a"), {"backend_id": "a"})
    with pytest.raises(LogprobContractError, match="prepend must be a bool"):
        r.register_logprob_backend(reference_backend("A", "a"), full_cap("a", "reference"),
                                   prepend=1)
    with pytest.raises(LogprobContractError, match="contract must be a LogprobContract"):
        r.get_logprob_op("contract")
    with pytest.raises(LogprobContractError, match="non-empty name"):
        Backend("  ", TorchLogSoftmaxOp)
    with pytest.raises(LogprobContractError, match="must be callable"):
        Backend("X", 42)
    with pytest.raises(LogprobContractError, match="kernels must be one of"):
        Backend.cpu("X", "x", kernels="fast")
    r.register_legacy_backend("batch_invariant_logp", Backend.cpu(
        "BI", "bi", kernels="batch_invariant"))
    assert r.get_op("batch_invariant_logp", device="cpu").backend_id == "bi"
    assert r.get_op("batch_invariant_logp", device=torch.device("cpu")).backend_id == "bi"
    with pytest.raises(RuntimeError, match="No functional backend found for "
                                           "batch_invariant_logp on cuda"):
        r.get_op("batch_invariant_logp", device="cuda:0")
    assert detlogp.get_op("batch_invariant_logp").backend_id == (
        detlogp.CPU_BATCH_INVARIANT_BACKEND_ID)
    assert np.array_equal(r.legacy_priority("batch_invariant_logp"), ["BI"])


GIL_SCRIPT = r"""
import threading, time
import detlogp
from test_registry import full_cap, qwen_tp2

class SlowOp:
    def forward(self, *a, **k): pass
    def backward(self, *a, **k): pass

def slow_factory():
    time.sleep(0.5)  # lets the GIL go while the other threads wait for this backend
    return SlowOp()

for reg in (detlogp.Registry(), None):
    if reg is None:  # the process-wide registry, through detlogp.get_logprob_op
        detlogp.register_logprob_backend(detlogp.Backend("SLOW", slow_factory),
                                         full_cap("slow", "production"), prepend=True)
        dispatch = detlogp.get_logprob_op
    else:
        reg.register_logprob_backend(detlogp.Backend("SLOW", slow_factory),
                                     full_cap("slow", "production"))
        dispatch = reg.get_logprob_op
    got = []
    threads = [threading.Thread(target=lambda: got.append(dispatch(qwen_tp2()).actual_backend))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == ["slow"] * 4, got
print("no deadlock")
"""


def test_a_factory_that_lets_the_gil_go_does_not_deadlock_other_dispatching_threads(tmp_path):
    """A thread waiting for a backend another thread's factory is building must not hold the
    GIL that factory needs back. Run in a child process: a deadlock there is a timeout
    here, not a hung test run."""
    from helpers import run_child_script

    proc = run_child_script(GIL_SCRIPT)
    assert proc.returncode == 0 and "no deadlock" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_in_a_factory_propagates_and_is_not_a_load_failure(stop):
    calls = []

    def factory():
        calls.append(1)
        if len(calls) == 1:
            raise stop()
        return TorchLogSoftmaxOp()

    r = Registry()
    r.register_logprob_backend(Backend("PY_LOG_SOFTMAX", factory), py_cap())
    with pytest.raises(stop):
        r.get_logprob_op(py_contract())
    assert not r.failed_to_load("PY_LOG_SOFTMAX")
    d = r.get_logprob_op(py_contract())  # not blacklisted: the factory runs again and serves
    assert d.actual_backend == "py-log-softmax" and len(calls) == 2


TORCH_API_PY_BACKEND_SCRIPT = r"""
import torch
import detlogp
import detlogp.torch as dt
from test_registry import DTYPES, ROLES, TorchLogSoftmaxOp

made = []
def factory():
    made.append(TorchLogSoftmaxOp())
    return made[-1]

# Registered on the default registry, as docs/python.md shows: detlogp.torch dispatches to it.
cap = detlogp.LogprobBackendCapability(
    backend_id=TorchLogSoftmaxOp.backend_id, roles=ROLES, dtypes=DTYPES, tp_world_sizes=(1,),
    supports_vocab_padding=True, mask_modes=("explicit_active_mask", "ignore_index"),
    exports_vocab_lse=True, determinism_scopes=("fixed_topology",),
    implementation_kind="production", reduction_orders=("canonical_tile_tree",))
detlogp.register_logprob_backend(detlogp.Backend("PY_LOG_SOFTMAX", factory), cap,
                                 prepend=True)
g = torch.Generator().manual_seed(0)
full = torch.randn(2, 7, 40, generator=g)
ids = torch.randint(0, 33, (2, 7), generator=g)
ids[0, 2] = -100
x = full.clone().requires_grad_()
logp = dt.vocab_parallel_logprobs(x[:, :-1], ids[:, 1:], real_vocab=33, deterministic=False)
assert made and made[0].calls == 1, "the Python backend was not called"
ref_x = full.clone().requires_grad_()
ref = torch.log_softmax(ref_x[:, :-1, :33], -1)
ref = ref.gather(-1, ids[:, 1:].clamp(min=0)[..., None])[..., 0]
ref = torch.where(ids[:, 1:] == -100, torch.zeros_like(ref), ref)
assert logp.shape == (2, 6) and torch.allclose(logp, ref, atol=1e-5), (logp, ref)
logp.sum().backward()
ref.sum().backward()
assert torch.allclose(x.grad, ref_x.grad, atol=1e-5)
print("python backend served detlogp.torch")
"""


def test_detlogp_torch_calls_a_python_backend_on_the_default_registry():
    """Child process: the default registry is process-wide."""
    from helpers import run_child_script

    proc = run_child_script(TORCH_API_PY_BACKEND_SCRIPT)
    assert proc.returncode == 0 and "served" in proc.stdout, proc.stdout + proc.stderr
