"""One rank of test_dtensor.py: detlogp on DTensors over gloo, on a 1-D TP mesh or a DP x TP mesh.

Every rank builds the same full logits (and lm_head) from one seed, distributes them as DTensors
and writes to <out>/rank<r>.pt what it saw: the local bits of detlogp's DTensor outputs and of
the DTensor gradient, their placements, the same call on the plain local tensors, and the TP=1
reference on the whole vocabulary; on the 1-D mesh also torch's own loss_parallel cross
entropy, a softcapped call, and the messages of the calls that must fail.
"""

from spawn import gloo_rank, record_failure

B, S, H = 4, 9, 16
# The vocabulary of each mesh: (padded columns, real vocabulary, tile width). 1150 columns over
# 3 ranks are DTensor's uneven split [0, 384) [384, 768) [768, 1150), on tile boundaries.
VOCAB = {"tp2": (1024, 1000, 128), "tp3": (1150, 1100, 128), "dp2xtp2": (1024, 1000, 128)}
SOFTCAP = 4.0  # the logits are ~N(0, 3): the cap bends most of them


def _data(padded, real, dtype):
    import torch

    g = torch.Generator().manual_seed(0)  # the same on every rank
    full = (torch.randn(B, S, padded, generator=g) * 3).to(dtype)
    ids = torch.randint(0, real, (B, S), generator=g)
    ids[0, 3] = -100
    mask = torch.ones(B, S)
    mask[1, :2] = 0  # a prompt (a float mask, like verl's)
    coef = torch.randn(2, B, S, generator=g)
    return full, ids, mask, coef


def _columns(padded, tp_mesh):
    """Every TP rank's columns by torch.chunk (DTensor's documented rule) and this rank's as
    DTensor itself splits them: the vocabulary positions of its local shard."""
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor

    table = [(int(c[0]), int(c[-1]) + 1) for c in torch.arange(padded).chunk(tp_mesh.size())]
    mine = distribute_tensor(torch.arange(padded), tp_mesh, (Shard(0),)).to_local()
    return table, (int(mine[0]), int(mine[-1]) + 1)


def _mesh(topology):
    from torch.distributed.device_mesh import init_device_mesh

    if topology == "dp2xtp2":
        return init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    return init_device_mesh("cpu", (int(topology[2:]),), mesh_dim_names=("tp",))


def _logprobs(mesh, topology, dtype, targets_as_dtensor, sub_mesh=False):
    """detlogp on the DTensor logits [B, S, V] (its tokens Shard(0) on "dp" where the mesh has
    it; with ``sub_mesh``, this DP rank's rows on the TP sub-mesh mesh["tp"]), its plain call on
    the local tensors, and the TP=1 reference of this rank's rows."""
    import torch
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import detlogp
    from detlogp.torch import (logprobs_from_logits, vocab_parallel_cross_entropy,
                               vocab_parallel_log_probs_from_logits, vocab_parallel_logprobs)

    padded, real, _ = VOCAB[topology]
    full, ids, mask, coef = _data(padded, real, dtype)
    if sub_mesh:  # each DP group its own rows, on its own TP sub-mesh
        dp = mesh.get_local_rank("dp")
        rows = slice(dp * B // 2, (dp + 1) * B // 2)
        full, ids, mask, coef = full[rows], ids[rows], mask[rows], coef[:, rows]
        mesh = mesh["tp"]
    two_d = mesh.ndim == 2
    logits_pl = (Shard(0), Shard(2)) if two_d else (Shard(2),)
    token_pl = (Shard(0), Replicate()) if two_d else (Replicate(),)
    rows = slice(None)
    if two_d:
        dp = mesh.get_local_rank("dp")
        rows = slice(dp * B // 2, (dp + 1) * B // 2)
    dt = distribute_tensor(full, mesh, logits_pl).requires_grad_()
    if targets_as_dtensor:
        tgt, lm = distribute_tensor(ids, mesh, token_pl), distribute_tensor(mask, mesh, token_pl)
    else:
        tgt, lm = ids[rows], mask[rows]
    logp, ent = vocab_parallel_logprobs(dt, tgt, loss_mask=lm, real_vocab=real, entropy=True)
    c1, c2 = (distribute_tensor(c, mesh, token_pl) for c in coef)
    ((logp * c1).sum() + (ent * c2).sum()).backward()

    tp_dim = mesh.ndim - 1
    bounds, (start, end) = _columns(padded, mesh["tp"])
    out = {"logp": logp.to_local().detach(), "entropy": ent.to_local().detach(),
           "placements": [repr(p) for p in logp.placements],
           "outputs": [type(t).__name__ for t in (logp, ent)],
           "grad": dt.grad.to_local(), "grad_type": type(dt.grad).__name__,
           "grad_placements": [repr(p) for p in dt.grad.placements],
           "input_placements": [repr(p) for p in dt.placements],
           "columns": (start, end), "table": bounds, "global_shape": tuple(logp.shape)}

    # The same call on plain tensors: the TP group and the bounds table given by hand.
    local = full[rows, :, start:end].clone().requires_grad_()
    p_logp, p_ent = vocab_parallel_logprobs(local, ids[rows], group=mesh.get_group(tp_dim),
                                            vocab_start=bounds, loss_mask=mask[rows],
                                            real_vocab=real, entropy=True)
    ((p_logp * coef[0][rows]).sum() + (p_ent * coef[1][rows]).sum()).backward()
    out.update(plain_logp=p_logp.detach(), plain_entropy=p_ent.detach(), plain_grad=local.grad)

    # TP=1: this rank's rows over the whole vocabulary.
    whole = full[rows].clone().requires_grad_()
    r_logp, r_ent = vocab_parallel_logprobs(whole, ids[rows], group=detlogp.SelfComm(),
                                            loss_mask=mask[rows], real_vocab=real, entropy=True)
    ((r_logp * coef[0][rows]).sum() + (r_ent * coef[1][rows]).sum()).backward()
    out.update(ref_logp=r_logp.detach(), ref_entropy=r_ent.detach(),
               ref_grad=whole.grad[..., start:end].contiguous())

    # The Megatron drop-in takes the DTensor too (group from the mesh).
    with torch.no_grad():
        ce = vocab_parallel_cross_entropy(dt, tgt, real_vocab=real)
        unmasked = vocab_parallel_logprobs(dt, tgt, real_vocab=real)
        verl_tp = vocab_parallel_log_probs_from_logits(dt, tgt, real_vocab=real)
        verl = logprobs_from_logits(dt, tgt, real_vocab=real)
    out.update(cross_entropy=ce.to_local(), unmasked_logp=unmasked.to_local(),
               verl_tp=verl_tp.to_local(), verl=verl.to_local())

    # Softcap and per-token temperatures reach the plain call (temperatures laid out as the
    # targets: a DTensor with the outputs' placements, or this rank's plain tensor).
    temps = 0.5 + torch.arange(ids.numel(), dtype=torch.float32).reshape(ids.shape) % 7 / 4
    temp = distribute_tensor(temps, mesh, token_pl) if targets_as_dtensor else temps[rows]
    with torch.no_grad():
        capped = vocab_parallel_logprobs(dt, tgt, real_vocab=real, softcap=2.0,
                                         temperature=temp)
        plain_capped = vocab_parallel_logprobs(local.detach(), ids[rows],
                                               group=mesh.get_group(tp_dim), vocab_start=bounds,
                                               real_vocab=real, softcap=2.0,
                                               temperature=temps[rows])
    out.update(capped=capped.to_local(), plain_capped=plain_capped)

    # Kept sets travel as the targets do: each token keeps its target and two neighbours
    # (ignored tokens keep none).
    sets = torch.stack([ids, (ids + 1) % real, (ids + 7) % real, torch.full_like(ids, -1)], -1)
    sets[ids < 0] = -1
    kept = distribute_tensor(sets, mesh, token_pl) if targets_as_dtensor else sets[rows]
    with torch.no_grad():
        on_kept = vocab_parallel_logprobs(dt, tgt, real_vocab=real, kept_ids=kept)
        plain_kept = vocab_parallel_logprobs(local.detach(), ids[rows],
                                             group=mesh.get_group(tp_dim), vocab_start=bounds,
                                             real_vocab=real, kept_ids=sets[rows])
    out.update(kept=on_kept.to_local(), plain_kept=plain_kept)
    return out


def _fused(mesh, topology, dtype):
    """The fused lm_head with a DTensor weight [V, H] (Shard(0)) on the TP (sub-)mesh and
    Replicate hidden states, against TP=1 on the whole weight."""
    import torch
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import detlogp

    tp_mesh = mesh["tp"]
    padded, real, _ = VOCAB[topology]
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(11, H, generator=g).to(dtype)
    weight = (torch.randn(padded, H, generator=g) * 0.5).to(dtype)
    ids = torch.randint(0, real, (11,), generator=g)
    w = distribute_tensor(weight, tp_mesh, (Shard(0),)).requires_grad_()
    h = distribute_tensor(hidden, tp_mesh, (Replicate(),)).requires_grad_()
    logp, lse = detlogp.fused_linear_logprobs(h, w, ids, real_vocab=real)
    (logp.sum() + 0.5 * lse.sum()).backward()
    _, (start, end) = _columns(padded, tp_mesh)
    ref_h, ref_w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    r_logp, r_lse = detlogp.fused_linear_logprobs(ref_h, ref_w, ids, real_vocab=real,
                                                  group=detlogp.SelfComm())
    (r_logp.sum() + 0.5 * r_lse.sum()).backward()
    return {"logp": logp.to_local().detach(), "lse": lse.to_local().detach(),
            "placements": [repr(p) for p in logp.placements],
            "grad_weight": w.grad.to_local(),
            "grad_weight_placements": [repr(p) for p in w.grad.placements],
            "grad_hidden": h.grad.to_local(),
            "grad_hidden_placements": [repr(p) for p in h.grad.placements],
            "ref_logp": r_logp.detach(), "ref_lse": r_lse.detach(),
            "ref_grad_weight": ref_w.grad[start:end].contiguous(), "ref_grad_hidden": ref_h.grad}


def _loss_parallel(mesh):
    """torch's own vocab-parallel cross entropy (loss_parallel) on the same DTensor logits, and
    torch's cross entropy on the whole logits (TP=1): per-token losses, fp32."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    g = torch.Generator().manual_seed(3)
    full = torch.randn(256, 1024, generator=g) * 3
    ids = torch.randint(0, 1024, (256,), generator=g)
    dt = distribute_tensor(full, mesh, (Shard(1),))
    with loss_parallel():
        torch_tp = F.cross_entropy(dt, distribute_tensor(ids, mesh, (Replicate(),)),
                                   reduction="none")
    import detlogp
    from detlogp.torch import vocab_parallel_cross_entropy

    return {"torch_tp": torch_tp.full_tensor(),
            "torch_tp1": F.cross_entropy(full, ids, reduction="none"),
            "detlogp_tp": vocab_parallel_cross_entropy(dt, ids).to_local(),
            "detlogp_tp1": vocab_parallel_cross_entropy(full, ids, group=detlogp.SelfComm())}


def _replicated(mesh):
    """DTensor logits that no mesh dim shards: every rank holds the whole vocabulary."""
    import torch
    from torch.distributed.tensor import Replicate, distribute_tensor

    import detlogp
    from detlogp.torch import vocab_parallel_logprobs

    full, ids, mask, _ = _data(1024, 1000, torch.float32)
    logp = vocab_parallel_logprobs(distribute_tensor(full, mesh, (Replicate(),)), ids,
                                   loss_mask=mask, real_vocab=1000)
    return {"logp": logp.to_local(), "placements": [repr(p) for p in logp.placements],
            "ref": vocab_parallel_logprobs(full, ids, loss_mask=mask, real_vocab=1000,
                                           group=detlogp.SelfComm())}


def _softcapped(mesh):
    """``softcap=`` on DTensor logits: the DTensor call and the plain call on the local shard
    (group and bounds by hand) with the same cap, logp and gradient; and the plain call without
    the cap (which must differ: the cap reached the call)."""
    import torch
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from detlogp.torch import vocab_parallel_logprobs

    padded, real, _ = VOCAB["tp2"]
    full, ids, mask, coef = _data(padded, real, torch.float32)
    dt = distribute_tensor(full, mesh, (Shard(2),)).requires_grad_()
    logp = vocab_parallel_logprobs(dt, ids, loss_mask=mask, real_vocab=real, softcap=SOFTCAP)
    (logp * distribute_tensor(coef[0], mesh, (Replicate(),))).sum().backward()
    bounds, (start, end) = _columns(padded, mesh)
    local = full[..., start:end].clone().requires_grad_()
    plain = dict(group=mesh.get_group(0), vocab_start=bounds, loss_mask=mask, real_vocab=real)
    p_logp = vocab_parallel_logprobs(local, ids, softcap=SOFTCAP, **plain)
    (p_logp * coef[0]).sum().backward()
    with torch.no_grad():
        uncapped = vocab_parallel_logprobs(local, ids, **plain)
    return {"logp": logp.to_local().detach(), "grad": dt.grad.to_local(),
            "plain_logp": p_logp.detach(), "plain_grad": local.grad, "uncapped": uncapped}


def _failures(mesh, out):
    import torch
    from torch.distributed.tensor import Partial, Shard, distribute_tensor

    from detlogp.torch import vocab_parallel_logprobs

    full, ids, _, _ = _data(1024, 1000, torch.float32)
    dt = distribute_tensor(full, mesh, (Shard(2),))
    record_failure(out, "group given", lambda: vocab_parallel_logprobs(
        dt, ids, group=mesh.get_group(0)))
    partial = dt.redistribute(mesh, (Shard(2),))
    partial = type(dt).from_local(partial.to_local(), mesh, (Partial(),), run_check=False)
    record_failure(out, "partial", lambda: vocab_parallel_logprobs(partial, ids))
    record_failure(out, "plain logits, DTensor targets", lambda: vocab_parallel_logprobs(
        full, distribute_tensor(ids, mesh, (Shard(0),))))
    # Rank 1's local shard is not its part of DTensor's split (a from_local gone wrong): rank 1
    # raises, and rank 0, already in the preflight, with it.
    rank = mesh.get_local_rank()
    wrong = type(dt).from_local(full[..., :512] if rank == 0 else full[..., :600], mesh,
                                (Shard(2),), run_check=False, shape=full.shape,
                                stride=full.stride())
    record_failure(out, "wrong local shard", lambda: vocab_parallel_logprobs(wrong, ids))
    # 1000 columns over 2 ranks: DTensor's bound at 500 is not on a tile (128) boundary; the
    # rank holding the split tile's first column completes it: the one-rank bits.
    import detlogp

    ragged = distribute_tensor(full[..., :1000], mesh, (Shard(2),))
    out["off the tiles"] = {
        "logp": vocab_parallel_logprobs(ragged, ids).full_tensor(),
        "one rank": vocab_parallel_logprobs(full[..., :1000], ids, group=detlogp.SelfComm())}


def _body(topology):
    import torch

    mesh = _mesh(topology)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        for as_dt in (False, True):
            out[f"logprobs {dtype} dtensor-targets={as_dt}"] = _logprobs(mesh, topology, dtype,
                                                                         as_dt)
        if topology == "dp2xtp2":
            out[f"logprobs {dtype} sub-mesh"] = _logprobs(mesh, topology, dtype, True, True)
        out[f"fused {dtype}"] = _fused(mesh, topology, dtype)
    if topology == "tp2":
        out["loss_parallel"] = _loss_parallel(mesh)
        out["replicated"] = _replicated(mesh)
        out["softcap"] = _softcapped(mesh)
        _failures(mesh, out)
    return out


def main(rank, world, init_file, out_dir, tests_dir, topology):
    import sys

    sys.path.insert(0, tests_dir)
    gloo_rank(rank, world, init_file, out_dir, lambda: _body(topology))
