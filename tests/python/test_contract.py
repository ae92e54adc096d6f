"""Contract types from Python: the compatible class names and keyword arguments, the Python-side
checks, the C++ validation messages passing through, and to_dict /
cross_rank_fingerprint equal to the C++ ones."""

import copy
import hashlib
import json
import pickle

import numpy as np
import pytest
import torch

import detlogp
from detlogp import (LogprobBackendCapability, LogprobContract, LogprobContractError,
                     LogprobOutputSpec, MaskSpec, ReductionSpec, ShardingSpec)
from detlogp import _detlogp

QWEN_BOUNDS = ((0, 76032), (76032, 152064))


def qwen_sharding(rank=0, cp_rank=0):
    return ShardingSpec(tp_rank=rank, tp_world_size=2, vocab_shard_bounds=QWEN_BOUNDS,
                        real_vocab_size=151936, padded_vocab_size=152064, cp_rank=cp_rank,
                        cp_world_size=2)


MASK = (False, False, True, True, True, True, True, False)


def qwen_contract(rank=0, cp_rank=0, **kw):
    args = dict(role="train", dtype="bf16", mask=MaskSpec(num_tokens=8, active_mask=MASK),
                sharding=qwen_sharding(rank, cp_rank), reduction=ReductionSpec(),
                output=LogprobOutputSpec(), export_lse=True)
    args.update(kw)
    return LogprobContract(**args)


def raises(match):
    return pytest.raises(LogprobContractError, match=match)


def error_of(fn):
    with pytest.raises(LogprobContractError) as info:
        fn()
    return info.value


def test_errors_from_cpp_carry_code_and_field():
    e = error_of(lambda: ShardingSpec(tp_rank=2, tp_world_size=2, vocab_shard_bounds=QWEN_BOUNDS,
                                      real_vocab_size=151936, padded_vocab_size=152064))
    assert (e.code, e.field) == ("conflicting_fields", "tp_rank")
    assert "tp_rank=2 must be smaller than tp_world_size=2" in str(e)
    e = error_of(lambda: qwen_contract(temperature=float("inf")))
    assert (e.code, e.field) == ("out_of_range", "temperature")
    e = error_of(lambda: qwen_contract(num_vocab_tiles=7))
    assert (e.code, e.field) == ("conflicting_fields", "num_vocab_tiles")
    e = error_of(lambda: qwen_sharding().owner_rank(151936))
    assert (e.code, e.field) == ("token_out_of_vocab", "token_id")
    e = error_of(lambda: detlogp.get_logprob_op(qwen_contract(), "deterministic"))
    assert (e.code, e.field) == ("reserved_name", "requested_backend")


def test_errors_raised_in_python_have_the_default_code():
    e = error_of(lambda: qwen_contract(mask=None))
    assert (e.code, e.field) == ("unspecified", "")
    assert LogprobContractError("x").code == "unspecified"


def test_error_type_is_a_value_error():
    assert issubclass(LogprobContractError, ValueError)
    with pytest.raises(ValueError):
        MaskSpec(num_tokens=0, active_mask=[])


# --- Python-side checks ("Python-only checks" in docs/python.md) -----------------------------


@pytest.mark.parametrize("field", ["tp_world_size", "real_vocab_size", "padded_vocab_size",
                                   "cp_world_size"])
def test_positive_ints_reject_bool(field):
    kw = dict(tp_rank=0, tp_world_size=1, vocab_shard_bounds=[(0, 8)], real_vocab_size=8,
              padded_vocab_size=8)
    kw[field] = True
    with raises(f"^{field} must be a positive integer; got True$"):
        ShardingSpec(**kw)


def test_int_checks_reject_bool_float_and_str():
    with raises("^tp_rank must be a non-negative integer; got False$"):
        ShardingSpec(tp_rank=False, tp_world_size=1, vocab_shard_bounds=[(0, 8)],
                     real_vocab_size=8, padded_vocab_size=8)
    with raises(r"^num_tokens must be a positive integer; got 2\.0$"):
        MaskSpec(num_tokens=2.0, active_mask=[True, True])
    with raises("^ignore_index must be an integer; got '-100'$"):
        MaskSpec(num_tokens=1, active_mask=[True], ignore_index="-100")
    with raises("^tile_width must be a positive integer; got True$"):
        qwen_contract(tile_width=True)
    with raises("^num_vocab_tiles must be a positive integer; got 1.5$"):
        qwen_contract(num_vocab_tiles=1.5)
    # numpy integers are integers
    s = ShardingSpec(tp_rank=np.int64(0), tp_world_size=np.int32(1),
                     vocab_shard_bounds=np.array([[0, 8]]), real_vocab_size=np.uint16(8),
                     padded_vocab_size=8)
    assert s.vocab_shard_bounds == ((0, 8),)


def test_mask_elements_must_be_real_bools():
    with raises(r"^active_mask\[2\] must be a bool; got 1$"):
        MaskSpec(num_tokens=3, active_mask=[True, False, 1])
    with raises(r"^active_mask\[0\] must be a bool; got 0$"):
        MaskSpec(num_tokens=1, active_mask=np.array([0]))
    with raises(r"^active_mask\[0\] must be a bool; got 1$"):
        MaskSpec(num_tokens=1, active_mask=torch.tensor([1]))
    with raises("^active_mask must be an iterable of booleans$"):
        MaskSpec(num_tokens=1, active_mask=5)
    # numpy / torch bool arrays and numpy bools are accepted
    a = MaskSpec(num_tokens=3, active_mask=np.array([True, False, True]))
    b = MaskSpec(num_tokens=3, active_mask=torch.tensor([True, False, True]))
    c = MaskSpec(num_tokens=3, active_mask=(True, np.bool_(False), True))
    assert a == b == c and a.active_mask == (True, False, True)


def test_deterministic_and_flags_must_be_bools():
    x, c = torch.zeros(8, 76032, dtype=torch.bfloat16), qwen_contract()
    op, _ = detlogp.get_logprob_op(qwen_contract())
    t = torch.zeros(8, dtype=torch.int64)
    with raises("^deterministic must be a bool; got 1$"):
        op(x, t, contract=c, deterministic=1)
    with raises("^validate must be a bool; got 0$"):
        op(x, t, contract=c, validate=0)
    with raises("^entropy must be a bool; got 'yes'$"):
        op(x, t, contract=c, entropy="yes")
    with raises("^contract must be a LogprobContract$"):
        op(x, t, contract=c.to_dict())


def test_contract_type_checks_in_validation_order():
    m, s = MaskSpec(num_tokens=8, active_mask=MASK), qwen_sharding()
    with raises("^role must be one of: train, infer; got 'Train'$"):
        LogprobContract(role="Train", dtype="bf16", mask=m, sharding=s)
    with raises("^dtype must be one of: bf16, fp16, fp32; got 'fp64'$"):
        LogprobContract(role="train", dtype="fp64", mask=m, sharding=s)
    with raises("^mask must be a MaskSpec$"):
        LogprobContract(role="train", dtype="bf16", mask=MASK, sharding=s)
    with raises("^sharding must be a ShardingSpec$"):
        LogprobContract(role="train", dtype="bf16", mask=m, sharding=m)
    with raises("^reduction must be a ReductionSpec$"):
        LogprobContract(role="train", dtype="bf16", mask=m, sharding=s, reduction="x")
    with raises("^output must be a LogprobOutputSpec$"):
        LogprobContract(role="train", dtype="bf16", mask=m, sharding=s, output=ReductionSpec())
    for bad in (False, 1, None):
        with raises("^export_lse must be True: "):
            LogprobContract(role="train", dtype="bf16", mask=m, sharding=s, export_lse=bad)
    for bad in (0, -1.0, float("nan"), float("inf"), True, "1"):
        with raises("^temperature must be a finite number > 0; got"):
            qwen_contract(temperature=bad)


def test_enums_accept_members_and_value_strings():
    a = qwen_contract(role=detlogp.Role.infer, dtype=detlogp.DType.fp16)
    b = qwen_contract(role="infer", dtype="fp16")
    assert a == b and a.role is detlogp.Role.infer and a.dtype == "fp16"
    r = ReductionSpec(determinism_scope="fixed_topology", order="global_vocab_shard_index")
    assert r.determinism_scope is detlogp.DeterminismScope.fixed_topology
    with raises("^merge must be one of: max_sumexp; got 'lse_average'$"):
        ReductionSpec(merge="lse_average")
    with raises("^transport must be one of: all_gather; got 'all_reduce'$"):
        ReductionSpec(transport="all_reduce")
    with raises("^determinism_scope must be one of: fixed_topology, cross_tp_bitwise; got 3$"):
        ReductionSpec(determinism_scope=3)
    # the Python enums are the C++ enums
    for cls in detlogp._enums.ALL_ENUMS:
        assert [m.value for m in cls] == _detlogp.enum_values(cls.__name__)


# --- C++ validation, same messages -----------------------------------------------------------


def test_cpp_validation_messages_pass_through():
    with raises("^tp_rank=2 must be smaller than tp_world_size=2$"):
        ShardingSpec(tp_rank=2, tp_world_size=2, vocab_shard_bounds=QWEN_BOUNDS,
                     real_vocab_size=151936, padded_vocab_size=152064)
    with raises("^cp_rank=1 must be smaller than cp_world_size=1$"):
        ShardingSpec(tp_rank=0, tp_world_size=1, vocab_shard_bounds=[(0, 8)],
                     real_vocab_size=8, padded_vocab_size=8, cp_rank=1)
    with raises("^padded_vocab_size=7 must not be smaller than real_vocab_size=8$"):
        ShardingSpec(tp_rank=0, tp_world_size=1, vocab_shard_bounds=[(0, 7)],
                     real_vocab_size=8, padded_vocab_size=7)
    with raises("exactly one \\(start, end\\) pair per TP rank; got 1 pairs for tp_world_size=2"):
        ShardingSpec(tp_rank=0, tp_world_size=2, vocab_shard_bounds=[(0, 8)],
                     real_vocab_size=8, padded_vocab_size=8)
    with raises(r"rank 1 starts at 5, expected 4"):
        ShardingSpec(tp_rank=0, tp_world_size=2, vocab_shard_bounds=[(0, 4), (5, 8)],
                     real_vocab_size=8, padded_vocab_size=8)
    with raises(r"must cover padded_vocab_size exactly; covered 6, declared 8"):
        ShardingSpec(tp_rank=0, tp_world_size=2, vocab_shard_bounds=[(0, 4), (4, 6)],
                     real_vocab_size=8, padded_vocab_size=8)
    with raises(r"^vocab_shard_bounds must be an iterable of \(start, end\) integer pairs$"):
        ShardingSpec(tp_rank=0, tp_world_size=1, vocab_shard_bounds=8, real_vocab_size=8,
                     padded_vocab_size=8)
    with raises(r"^vocab_shard_bounds\[0\] must be a pair of integers; got \(0, True\)$"):
        ShardingSpec(tp_rank=0, tp_world_size=1, vocab_shard_bounds=[(0, True)],
                     real_vocab_size=8, padded_vocab_size=8)
    with raises("^active_mask must contain exactly one entry per token; got 2 entries for "
                "num_tokens=3$"):
        MaskSpec(num_tokens=3, active_mask=[True, True])
    with raises("^TP logprob accumulation must be fp32; got bf16$"):
        ReductionSpec(acc_dtype="bf16")
    with raises("^selected logprob output must be fp32; got bf16$"):
        LogprobOutputSpec(selected_logp_dtype="bf16")
    with raises("^vocab LSE output must be fp32; got fp16$"):
        LogprobOutputSpec(lse_dtype="fp16")
    with raises(r"^ignore_index=5 must not collide with the real vocabulary \[0, 151936\)$"):
        qwen_contract(mask=MaskSpec(num_tokens=8, active_mask=MASK, ignore_index=5))
    qwen_contract(mask=MaskSpec(num_tokens=8, active_mask=MASK, ignore_index=151937))  # padding
    with raises("^num_vocab_tiles=7 must divide padded_vocab_size=152064 exactly$"):
        qwen_contract(num_vocab_tiles=7)
    with raises(r"token_id=151940 is outside the real vocabulary \[0, 151936\)"):
        qwen_sharding().owner_rank(151940)
    assert qwen_sharding().owner_rank(76032) == 1


def test_derived_fields_and_goldens():
    s = qwen_sharding(rank=1)
    assert (s.local_vocab_start, s.local_vocab_end, s.local_vocab_size) == (76032, 152064, 76032)
    assert s.vocab_shard_bounds == QWEN_BOUNDS
    m = MaskSpec(num_tokens=8, active_mask=MASK)
    assert m.active_token_count == 5
    assert m.active_mask_sha256 == (
        "540fcad9a073311f536f7b0edf84c397681c9b90bb2ebb9e4a5793f06c3ed3d7")
    m2 = MaskSpec(num_tokens=8, active_mask=[True] * 5 + [False] * 3)
    assert m2.active_mask_sha256 == (
        "c7fb710baec0c5f2d119354c8d4d0c8b732eb85d63649bfa97be0f3b728d826b")
    assert MaskSpec.all_active(4) == MaskSpec(num_tokens=4, active_mask=[True] * 4)
    c = qwen_contract(num_vocab_tiles=64)
    assert c.tile_width == 152064 // 64 and c.num_vocab_tiles == 64
    assert qwen_contract().tile_width == detlogp.DEFAULT_TILE_WIDTH == 128
    assert detlogp.even_bounds(152064, 2) == QWEN_BOUNDS
    assert detlogp.megatron_bounds(151936, 8)[0] == 152576
    assert detlogp.megatron_padded_vocab(151936, 2) == 152064


# --- to_dict and fingerprint ------------------------------------------------------------------


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def test_to_dict_is_the_cpp_json_and_fingerprint_recomputes():
    c = qwen_contract(temperature=0.7, tile_width=64)
    d = c.to_dict()
    assert canonical(d) == c.to_json() == c._cpp.to_json()
    assert d["semantic_operator"] == "selected_token_logprob"
    assert d["mask"]["active_mask_sha256"] == c.mask.active_mask_sha256
    assert "active_mask" not in d["mask"]
    assert d["sharding"]["vocab_shard_bounds"] == [list(b) for b in QWEN_BOUNDS]
    assert d["reduction"]["cp_is_merge_axis"] is False
    for key in ("tp_rank", "cp_rank", "local_vocab_start", "local_vocab_end"):
        del d["sharding"][key]
    assert c.cross_rank_fingerprint() == hashlib.sha256(canonical(d).encode()).hexdigest()


def test_fingerprint_is_rank_independent_and_sensitive():
    fps = {qwen_contract(rank=r, cp_rank=cp).cross_rank_fingerprint()
           for r in (0, 1) for cp in (0, 1)}
    assert len(fps) == 1
    base = fps.pop()
    variants = [
        qwen_contract(dtype="fp32"),
        qwen_contract(role="infer"),
        qwen_contract(mask=MaskSpec(num_tokens=8, active_mask=[True] * 5 + [False] * 3)),
        qwen_contract(mask=MaskSpec(num_tokens=8, active_mask=MASK, ignore_index=-1)),
        qwen_contract(reduction=ReductionSpec(determinism_scope="fixed_topology")),
        qwen_contract(temperature=0.5),
        qwen_contract(tile_width=256),
    ]
    got = [v.cross_rank_fingerprint() for v in variants]
    assert base not in got and len(set(got)) == len(got)


def test_frozen_equality_pickle_replace():
    c = qwen_contract(temperature=0.7)
    with pytest.raises(AttributeError):
        c.role = "infer"
    with pytest.raises(AttributeError):
        c.sharding.tp_rank = 1
    for other in (pickle.loads(pickle.dumps(c)), copy.deepcopy(c)):
        assert other == c and hash(other) == hash(c)
        assert other.cross_rank_fingerprint() == c.cross_rank_fingerprint()
        assert other.to_json() == c.to_json()
    d = c.replace(sharding=qwen_sharding(rank=1))
    assert d.sharding.tp_rank == 1 and d != c
    assert d.cross_rank_fingerprint() == c.cross_rank_fingerprint()
    assert c.replace(role="infer").role == "infer"
    assert pickle.loads(pickle.dumps(qwen_contract(num_vocab_tiles=64))).num_vocab_tiles == 64


# --- capability -------------------------------------------------------------------------------


def full_capability(**kw):
    args = dict(backend_id="my-backend", roles={"train", "infer"},
                dtypes={"bf16", "fp16", "fp32"}, supports_vocab_padding=True,
                mask_modes={"explicit_active_mask", "ignore_index"}, exports_vocab_lse=True,
                determinism_scopes={"cross_tp_bitwise", "fixed_topology"})
    args.update(kw)
    return LogprobBackendCapability(**args)


def test_capability_validation():
    assert full_capability(backend_id="  padded-id  ").backend_id == "padded-id"


@pytest.mark.parametrize("message, bad", [
    ("^backend_id='Deterministic' shadows a reserved dispatch policy keyword$",
     {"backend_id": "Deterministic"}),
    ("^backend_id must be a non-empty string$", {"backend_id": "  "}),
    ("^backend_id must be a non-empty string$", {"backend_id": 3}),
    ("^roles and dtypes must be iterables of enum values$", {"roles": 5}),
    ("^backend roles and dtypes must not be empty$", {"dtypes": []}),
    ("^tp_world_sizes must not be empty; use None for unrestricted$", {"tp_world_sizes": []}),
    (r"^tp_world_sizes\[1\] must be a positive integer; got True$",
     {"tp_world_sizes": [1, True]}),
    ("^mask_modes and determinism_scopes must be iterables of enum values$",
     {"mask_modes": None}),
    ("^supports_vocab_padding must be a bool; got 1$", {"supports_vocab_padding": 1}),
    ("^implementation_kind must be one of: production, reference",
     {"implementation_kind": "fast"}),
])
def test_capability_rejects_bad_fields(message, bad):
    with raises(message):
        full_capability(**bad)


def test_capability_incompatibilities_in_order():
    c = qwen_contract()
    assert full_capability().incompatibilities(c) == ()
    assert full_capability().supports(c)
    narrow = LogprobBackendCapability(backend_id="narrow", roles=["infer"], dtypes=["fp32"],
                                      tp_world_sizes=[1], cp_world_sizes=[1])
    assert narrow.incompatibilities(c) == (
        "role=train is unsupported", "dtype=bf16 is unsupported", "TP=2 is unsupported",
        "CP=2 is unsupported", "padded-vs-real vocab masking is unsupported",
        "explicit active-token masking is unsupported",
        "vocab-domain LSE export is unsupported",
        "determinism_scope=cross_tp_bitwise is unsupported")
    d = narrow.to_dict()
    assert d["roles"] == ["infer"] and d["tp_world_sizes"] == [1]
    assert narrow.tp_world_sizes == (1,) and narrow.roles == {detlogp.Role.infer}
    assert pickle.loads(pickle.dumps(narrow)) == narrow
