"""detlogp.torch on one rank: N-D inputs read in place (causal shift, Megatron layout), every
mask form, ignore_index, torch dtypes, inferred bounds, drop-ins bitwise equal to the contract
API, contract caching, threads, the gradient buffer pool, the transport device selection."""

import numpy as np
import pytest
import torch

import detlogp
import detlogp._comm as dcomm
from detlogp._call import LogitsCall
import detlogp.torch as dt
from detlogp._torch_args import vocab_bounds
from helpers import assert_bitwise, bits

REAL, V = 1000, 1024
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def logits_and_ids(b=3, s=7, v=V, dtype=torch.float32, stream=0):
    g = torch.Generator().manual_seed(stream)
    x = (torch.randn(b, s, v, generator=g) * 3).to(dtype)
    ids = torch.randint(0, REAL, (b, s), generator=g)
    return x, ids


def reference(x2d, targets, active, entropy=True, real=None, grad_weights=None):
    """The contract API on an explicit contiguous [tokens, V] copy (rows are independent, so
    the row count does not change any row's bits)."""
    x2d = x2d.detach().contiguous()
    n = x2d.shape[0]
    sharding = detlogp.ShardingSpec(tp_rank=0, tp_world_size=1,
                                    vocab_shard_bounds=[(0, x2d.shape[1])],
                                    real_vocab_size=real or x2d.shape[1],
                                    padded_vocab_size=x2d.shape[1])
    c = detlogp.LogprobContract(role="train", dtype={torch.float32: "fp32",
                                                     torch.bfloat16: "bf16",
                                                     torch.float16: "fp16"}[x2d.dtype],
                                mask=detlogp.MaskSpec(n, [bool(a) for a in active]),
                                sharding=sharding)
    op, _ = detlogp.get_logprob_op(c)
    leaf = x2d.clone().requires_grad_()
    outs = op(leaf, targets.reshape(-1), contract=c, entropy=entropy)
    if grad_weights is not None:
        (grad_weights[0] * outs[0]).sum().backward() if not entropy else \
            ((grad_weights[0] * outs[0]).sum() + (grad_weights[1] * outs[2]).sum()).backward()
        return outs, leaf.grad
    return outs, None


@pytest.fixture
def spy(monkeypatch):
    """Records every run of the logits op: the address of the buffer the C++ op saved (= read),
    its rows and the kernels' thread count."""
    seen = []
    original = LogitsCall.run

    def run(self, again=None):
        f = original(self, again)
        seen.append({"ptr": f.saved_logits_data_ptr, "rows": self.view[2],
                     "threads": self.threads})
        return f

    monkeypatch.setattr(LogitsCall, "run", run)
    return seen


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_causal_shift_reads_the_callers_buffer(spy, dtype):
    x, ids = logits_and_ids(dtype=DTYPES[dtype])
    x.requires_grad_()
    shifted = x[:, :-1]  # a view: rows of one batch are V apart, batches s * V apart
    assert not shifted.is_contiguous()
    logp, ent = dt.vocab_parallel_logprobs(shifted, ids[:, 1:], entropy=True)
    assert logp.shape == ent.shape == (3, 6) and logp.dtype == torch.float32
    assert spy[-1]["ptr"] == x.data_ptr()  # the C++ op read the caller's buffer
    assert spy[-1]["rows"] == 3 * 7 - 1  # the cover: one hole row per sequence boundary
    gw = torch.randn(3, 6), torch.randn(3, 6)
    ((gw[0] * logp).sum() + (gw[1] * ent).sum()).backward()

    flat = shifted.reshape(-1, V)  # the explicit copy the old API needed
    (rlogp, _, rent), rgrad = reference(flat, ids[:, 1:], [True] * 18,
                                        grad_weights=(gw[0].reshape(-1), gw[1].reshape(-1)))
    assert_bitwise(logp.reshape(-1), rlogp, "logp")
    assert_bitwise(ent.reshape(-1), rent, "entropy")
    assert_bitwise(x.grad[:, :-1].reshape(-1, V), rgrad, "grad")
    assert torch.all(x.grad[:, -1] == 0)  # the last position received nothing


def test_megatron_layout_and_column_slices_are_read_in_place(spy):
    full = torch.randn(5, 2, 2 * V)  # [s, b, 2 shards]: a column slice is one TP shard
    shard = full[..., V:]
    ids = torch.randint(0, REAL, (5, 2))
    logp = dt.vocab_parallel_logprobs(shard, ids)
    assert spy[-1]["ptr"] == shard.data_ptr() and spy[-1]["rows"] == 10
    (rlogp, _), _ = reference(shard.reshape(-1, V), ids, [True] * 10, entropy=False)
    assert_bitwise(logp.reshape(-1), rlogp)
    # Batch-first transposed view of the same buffer: rows permuted, still in place.
    logp_t = dt.vocab_parallel_logprobs(shard.transpose(0, 1), ids.t())
    assert spy[-1]["ptr"] == shard.data_ptr()
    assert_bitwise(logp_t, logp.t().contiguous())


def test_vocab_dim_not_contiguous_is_copied_and_still_correct(spy):
    x = torch.randn(V, 6)  # logits.t() is [6, V] with vocab stride 6
    ids = torch.randint(0, REAL, (6,))
    logp = dt.vocab_parallel_logprobs(x.t(), ids)
    assert spy[-1]["ptr"] != x.data_ptr()
    (rlogp, _), _ = reference(x.t(), ids, [True] * 6, entropy=False)
    assert_bitwise(logp, rlogp)


@pytest.mark.parametrize("form", ["bool", "int64", "int32", "float32", "bf16", "list"])
def test_loss_mask_forms(form):
    x, ids = logits_and_ids()
    keep = torch.rand(3, 7, generator=torch.Generator().manual_seed(5)) > 0.3
    mask = {"bool": keep, "int64": keep.long(), "int32": keep.int(), "float32": keep.float(),
            "bf16": keep.bfloat16(), "list": keep.tolist()}[form]
    logp = dt.vocab_parallel_logprobs(x, ids, loss_mask=mask)
    (rlogp, _), _ = reference(x.reshape(-1, V), ids, keep.reshape(-1).tolist(), entropy=False)
    assert_bitwise(logp.reshape(-1), rlogp)
    assert np.all(bits(logp[~keep]) == 0)  # unscored tokens: exactly +0.0


def test_ignore_index_and_loss_mask_combine():
    x, ids = logits_and_ids()
    ids[0, 2] = -100
    ids[2, 5] = -100
    keep = torch.ones(3, 7, dtype=torch.bool)
    keep[1, 1] = False
    logp = dt.vocab_parallel_logprobs(x, ids, loss_mask=keep)
    active = (ids != -100) & keep
    (rlogp, _), _ = reference(x.reshape(-1, V), ids, active.reshape(-1).tolist(),
                              entropy=False)
    assert_bitwise(logp.reshape(-1), rlogp)
    assert int((bits(logp) == 0).sum()) >= 3
    # Another ignore_index; None: no rule (then -100 is an out-of-vocabulary target).
    ids2 = ids.clone()
    ids2[ids2 == -100] = -1
    assert_bitwise(dt.vocab_parallel_logprobs(x, ids2, loss_mask=keep, ignore_index=-1), logp)
    with pytest.raises(detlogp.LogprobContractError, match="real vocabulary"):
        dt.vocab_parallel_logprobs(x, ids, ignore_index=None)


def test_real_vocab_excludes_padding_and_temperature():
    x, ids = logits_and_ids()
    x[..., REAL:] = 1e4  # padding columns: must never count
    logp = dt.vocab_parallel_logprobs(x, ids, real_vocab=REAL, temperature=0.7)
    ref = torch.log_softmax(x[..., :REAL].double() / 0.7, -1).gather(-1, ids[..., None])[..., 0]
    assert torch.allclose(logp.double(), ref, atol=1e-4)
    c = dt.vocab_parallel_logprobs(x, ids, real_vocab=REAL, return_contract=True)[-1]
    assert c.sharding.real_vocab_size == REAL and c.sharding.padded_vocab_size == V


def test_inferred_bounds_are_megatron_bounds():
    for real, tp in [(151936, 2), (151936, 4), (32000, 8), (50257, 2)]:
        padded, bounds = detlogp.megatron_bounds(real, tp)
        width = padded // tp
        for rank in range(tp):
            got, got_padded = vocab_bounds(None, width, tp, rank)
            assert got_padded == padded and [tuple(b) for b in got] == \
                [tuple(b) for b in bounds]
            assert vocab_bounds(rank * width, width, tp, rank)[0] == got
    with pytest.raises(detlogp.LogprobContractError, match="vocab_start"):
        vocab_bounds(5, 100, 2, 1)
    assert vocab_bounds([(0, 100), (100, 150)], 50, 2, 1) == (((0, 100), (100, 150)), 150)


def test_drop_ins_equal_the_contract_api():
    x, ids = logits_and_ids(dtype=torch.bfloat16)
    xs = x.transpose(0, 1).contiguous()  # Megatron: [s, b, v]
    loss = dt.vocab_parallel_cross_entropy(xs, ids.t())
    (rlogp, _), _ = reference(xs.reshape(-1, V), ids.t(), [True] * 21, entropy=False)
    assert loss.shape == (7, 3) and loss.dtype == torch.float32
    assert_bitwise(loss.reshape(-1), -rlogp)
    with pytest.raises(detlogp.LogprobContractError, match="label_smoothing"):
        dt.vocab_parallel_cross_entropy(xs, ids.t(), 0.1)
    lp = dt.logprobs_from_logits(x, ids)
    assert_bitwise(lp, -dt.vocab_parallel_cross_entropy(x, ids))
    (rlogp2, _), _ = reference(x.reshape(-1, V), ids, [True] * 21, entropy=False)
    assert_bitwise(lp.reshape(-1), rlogp2)
    assert_bitwise(dt.vocab_parallel_log_probs_from_logits(x, ids), lp)
    # 2-D [tokens, vocab] like verl's rmpad path.
    assert_bitwise(dt.logprobs_from_logits(x.reshape(-1, V), ids.reshape(-1)), rlogp2)


def test_entropy_drop_ins_are_the_entropy_output():
    x, ids = logits_and_ids(dtype=torch.bfloat16)
    (_, _, rent), _ = reference(x.reshape(-1, V), ids, [True] * 21)
    ent = dt.entropy_from_logits(x)
    assert ent.shape == (3, 7) and ent.dtype == torch.float32
    assert_bitwise(ent.reshape(-1), rent)
    assert_bitwise(dt.vocab_parallel_entropy(x), ent)
    # The gradient is the entropy's: the targets the drop-ins pick never enter it.
    w = torch.randn(3, 7, generator=torch.Generator().manual_seed(5))
    grads = []
    for fn in (dt.entropy_from_logits, dt.vocab_parallel_entropy,
               lambda leaf: dt.vocab_parallel_logprobs(leaf, ids, entropy=True)[1]):
        leaf = x.clone().requires_grad_()
        (fn(leaf) * w).sum().backward()
        grads.append(leaf.grad)
    assert_bitwise(grads[0], grads[2])
    assert_bitwise(grads[1], grads[2])


def test_cross_entropy_takes_megatrons_tp_group():
    x, ids = logits_and_ids()
    one = detlogp.SelfComm()
    loss = dt.vocab_parallel_cross_entropy(x, ids)
    assert_bitwise(dt.vocab_parallel_cross_entropy(x, ids, 0.0, one), loss)
    assert_bitwise(dt.vocab_parallel_cross_entropy(x, ids, tp_group=one, group=one), loss)
    with pytest.raises(detlogp.LogprobContractError, match="two different groups"):
        dt.vocab_parallel_cross_entropy(x, ids, tp_group=one, group=detlogp.SelfComm())


def test_contract_is_cached_across_micro_batches():
    cache = dt.CallCache()
    x, ids = logits_and_ids()
    keep = torch.ones(3, 7, dtype=torch.bool)
    keep[0, :3] = False
    c1 = dt.vocab_parallel_logprobs(x, ids, loss_mask=keep, cache=cache, return_contract=True)[-1]
    x2, ids2 = logits_and_ids(stream=1)  # next micro-batch: new data, same shape and mask
    c2 = dt.vocab_parallel_logprobs(x2, ids2, loss_mask=keep, cache=cache,
                                    return_contract=True)[-1]
    assert c2 is c1
    assert cache.stats["contract_misses"] == 1 and cache.stats["contract_hits"] == 1
    keep[1, 0] = False  # another mask: another contract
    c3 = dt.vocab_parallel_logprobs(x2, ids2, loss_mask=keep, cache=cache,
                                    return_contract=True)[-1]
    assert c3 is not c1 and c3.mask.active_token_count == c1.mask.active_token_count - 1
    assert c1.to_dict()["mask"]["num_tokens"] == 21


def test_threads_default_and_bits(spy):
    x, ids = logits_and_ids()
    a = dt.vocab_parallel_logprobs(x, ids)
    assert spy[-1]["threads"] == torch.get_num_threads()
    b = dt.vocab_parallel_logprobs(x, ids, threads=2)
    assert spy[-1]["threads"] == 2
    assert_bitwise(a, b)
    leaf = x.clone().requires_grad_()
    dt.vocab_parallel_logprobs(leaf, ids, threads=3).sum().backward()
    assert spy[-1]["threads"] == 3
    with pytest.raises(detlogp.LogprobContractError, match="threads"):
        dt.vocab_parallel_logprobs(x, ids, threads=-1)
    # The contract API: torch's thread count by default, on the autograd path too.
    c = dt.vocab_parallel_logprobs(x, ids, return_contract=True)[-1]
    op = detlogp.get_logprob_op(c).op
    op(x.reshape(-1, V), ids.reshape(-1), contract=c)
    assert spy[-1]["threads"] == torch.get_num_threads()
    leaf = x.reshape(-1, V).clone().requires_grad_()
    op(leaf, ids.reshape(-1), contract=c, threads=2)[0].sum().backward()
    assert spy[-1]["threads"] == 2


def test_gradient_buffers_are_reused_once_free():
    cache = dt.CallCache(min_pooled_bytes=0)
    x, ids = logits_and_ids()
    grads = []
    for _ in range(2):
        leaf = x.clone().requires_grad_()
        dt.vocab_parallel_logprobs(leaf, ids, cache=cache).sum().backward()
        grads.append(leaf.grad)  # held: the next backward must get another buffer
    assert grads[0].data_ptr() != grads[1].data_ptr()
    assert cache.stats["grad_allocs"] == 2 and cache.stats["grad_reuses"] == 0
    held = grads[1].clone()
    ptrs = {g.data_ptr() for g in grads}
    del grads, leaf  # nothing refers to either buffer any more
    leaf = x.clone().requires_grad_()
    dt.vocab_parallel_logprobs(leaf, ids, cache=cache).sum().backward()
    assert cache.stats["grad_reuses"] == 1 and cache.stats["grad_allocs"] == 2
    assert leaf.grad.data_ptr() in ptrs
    assert_bitwise(leaf.grad, held)  # a reused buffer is fully overwritten


def test_entropy_without_gradient():
    x, ids = logits_and_ids()
    leaf = x.clone().requires_grad_()
    logp, ent = dt.vocab_parallel_logprobs(leaf, ids, entropy=True, entropy_grad=False)
    assert logp.requires_grad and not ent.requires_grad
    logp.sum().backward()
    leaf2 = x.clone().requires_grad_()
    dt.vocab_parallel_logprobs(leaf2, ids).sum().backward()
    assert_bitwise(leaf.grad, leaf2.grad)


def test_input_errors():
    x, ids = logits_and_ids()
    with pytest.raises(detlogp.LogprobContractError, match="float64"):
        dt.vocab_parallel_logprobs(x.double(), ids)
    with pytest.raises(detlogp.LogprobContractError, match="integers"):
        dt.vocab_parallel_logprobs(x, ids.float())
    with pytest.raises(detlogp.LogprobContractError, match="leading shape"):
        dt.vocab_parallel_logprobs(x, ids[:, 1:])
    with pytest.raises(detlogp.LogprobContractError, match="loss_mask"):
        dt.vocab_parallel_logprobs(x, ids, loss_mask=torch.ones(3, 6))
    with pytest.raises(detlogp.LogprobContractError, match="device type 'meta'"):
        dt.vocab_parallel_logprobs(torch.empty(3, 7, V, device="meta"), ids)
    assert dt.vocab_parallel_logprobs(x[:0], ids[:0]).shape == (0, 7)  # empty, as torch


def test_transport_device_selection(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert dcomm.transport_device("gloo") is None
    assert dcomm.transport_device("mpi") is None
    assert dcomm.transport_device("cpu:gloo,cuda:nccl") is None
    assert dcomm.transport_device("nccl") == torch.device("cuda", 3)
    assert dcomm.transport_device("NCCL") == torch.device("cuda", 3)
    assert dcomm.transport_device("ucc") == torch.device("cuda", 3)


def test_nccl_group_gathers_device_tensors(monkeypatch):
    """A group whose backend says nccl gets the device path: the bytes go through tensors on
    the device (here the mocked device is the CPU so the path runs without a GPU)."""
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(dcomm, "transport_device",
                        lambda backend: calls.append(backend) or torch.device("cpu"))

    class Done:  # a completed torch.distributed Work (the transport waits with a timeout)
        def wait(self, timeout=None):
            return True

    def fake_all_gather(outs, send, group=None, async_op=False):
        calls.append(("all_gather", send.device.type, len(outs)))
        for k, o in enumerate(outs):
            o.copy_(send)
            o[1:] += k  # the payload; byte 0 is the transport's own (no overlap seen)
        return Done() if async_op else None

    monkeypatch.setattr(dist, "all_gather", fake_all_gather)
    comm = dcomm.TorchDistributedComm(object())
    got = comm.all_gather(bytes([1, 2, 3]))
    assert calls[0] == "nccl" and calls[1] == ("all_gather", "cpu", 2)
    assert got == bytes([1, 2, 3, 2, 3, 4])
    assert comm.name == "torch.distributed:nccl"


def test_mask_spec_from_bool_arrays_equals_the_list_form():
    keep = np.random.default_rng(3).random(1000) > 0.4
    ref = detlogp.MaskSpec(1000, keep.tolist(), ignore_index=-7)
    for form in (keep, torch.from_numpy(keep), keep[::-1].copy()[::-1]):
        m = detlogp.MaskSpec(1000, form, ignore_index=-7)
        assert m == ref and m.active_mask_sha256 == ref.active_mask_sha256
    with pytest.raises(detlogp.LogprobContractError, match="one entry per token"):
        detlogp.MaskSpec(999, keep)


def test_one_token_and_many_leading_dims(spy):
    x = torch.randn(V)
    logp = dt.vocab_parallel_logprobs(x, torch.tensor(5))
    assert logp.shape == ()
    (rlogp, _), _ = reference(x[None], torch.tensor([5]), [True], entropy=False)
    assert_bitwise(logp.reshape(1), rlogp)
    x4 = torch.randn(2, 3, 4, V)
    t4 = torch.randint(0, REAL, (2, 3, 4))
    leaf = x4.clone().requires_grad_()
    got = dt.vocab_parallel_logprobs(leaf[:, :, :-1], t4[:, :, :-1],
                                     loss_mask=np.ones((2, 3, 3), dtype=np.int8))
    assert spy[-1]["ptr"] == leaf.data_ptr()
    got.sum().backward()
    (rlogp, _), rgrad = reference(x4[:, :, :-1].reshape(-1, V), t4[:, :, :-1], [True] * 18,
                                  entropy=False, grad_weights=(torch.ones(18),))
    assert_bitwise(got.reshape(-1), rlogp)
    assert_bitwise(leaf.grad[:, :, :-1].reshape(-1, V), rgrad)


@pytest.mark.parametrize("field", ["contracts", "grad_buffers", "min_pooled_bytes"])
def test_call_cache_sizes_must_be_non_negative(field):
    with pytest.raises(detlogp.LogprobContractError,
                       match=rf"{field} must be a non-negative integer \(0: keep none\); got -1"):
        dt.CallCache(**{field: -1})
    with pytest.raises(detlogp.LogprobContractError,
                       match=f"{field} must be a non-negative integer"):
        dt.CallCache(**{field: 1.5})
    assert dt.CallCache(**{field: 0}) is not None
