"""One rank of test_layouts.py: two TP ranks (gloo) that pass the same logical logits in
different memory layouts, the same layout (read in place), and empty micro-batches.

Every rank runs every scenario in the same order and writes what it saw to <out>/rank<r>.pt:
for each scenario its logp, entropy and gradient (or the error), the TP=1 values computed on
the same rank from the whole logits in logical order, and the buffers the operator read.
"""

import sys
import time

S, B, H, REAL, V, TP = 5, 3, 16, 1000, 1024, 2
W = V // TP


def _data():
    import torch

    g = torch.Generator().manual_seed(0)  # the same on every rank
    full_sbv = (torch.randn(S, B, V, generator=g) * 3)  # Megatron's [s, b, v]
    ids = torch.randint(0, REAL, (B, S), generator=g)
    mask = torch.ones(B, S)
    mask[1, :2] = 0
    return full_sbv, ids, mask


def _spy():
    """Records the buffer the C++ op read and the rows layout of every run of the logits op
    (a run that joins the preflight once more is one run)."""
    from detlogp._call import LogitsCall

    seen = []
    original = LogitsCall.run

    def run(self, again=None):
        entry = {"layout": self.rows_layout}
        seen.append(entry)
        f = original(self, again)
        entry["ptr"] = f.saved_logits_data_ptr
        return f

    LogitsCall.run = run
    return seen


def _run(leaf_of, view_of, targets, mask, group, w1, w2):
    """logp, entropy and this rank's gradient in logical [b, s, v/tp] order, or the error."""
    import detlogp.torch as dt

    leaf = leaf_of().requires_grad_()
    t0 = time.monotonic()
    try:
        logp, ent = dt.vocab_parallel_logprobs(view_of(leaf), targets, group=group,
                                               real_vocab=REAL, loss_mask=mask, entropy=True)
    except Exception as e:  # noqa: BLE001 - recorded for the parent's assertion
        return {"error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - t0}
    ((w1 * logp).sum() + (w2 * ent).sum()).backward()
    grad = view_of(leaf.grad)
    return {"logp": logp.detach(), "entropy": ent.detach(),
            "grad": grad.contiguous() if grad is not None else None,
            "base_ptr": leaf.data_ptr(), "seconds": time.monotonic() - t0}


def _scenarios(rank, group):
    import torch

    import detlogp
    import detlogp.torch as dt

    out = {}
    seen = _spy()
    full_sbv, ids, mask = _data()
    full = full_sbv.transpose(0, 1).contiguous()  # the logical [b, s, v]
    s, e = rank * W, (rank + 1) * W
    g = torch.Generator().manual_seed(1)
    w1, w2 = torch.randn(B, S, generator=g), torch.randn(B, S, generator=g)
    one = detlogp.SelfComm()

    def reference(targets, msk, shift=False):
        cut = (lambda x: x[:, :-1]) if shift else (lambda x: x)
        r = _run(lambda: full.clone(), lambda x: cut(x), targets, msk, one,
                 cut(w1), cut(w2))
        r["grad"] = r["grad"][..., s:e].contiguous()
        return r

    same = torch.full((B, S), 7)
    ones = torch.ones(B, S)
    transposed = (lambda: full_sbv.clone(), lambda x: x[..., s:e].transpose(0, 1))
    contiguous = (lambda: full.clone(), lambda x: x[..., s:e])
    mine = transposed if rank == 0 else contiguous
    # 1. Megatron's layout (a transposed view) on rank 0, contiguous on rank 1; targets all
    #    equal and all active, so that no digest of the row order can tell the two apart.
    out["transposed vs contiguous, equal targets"] = _run(*mine, same, ones, group, w1, w2)
    out["transposed vs contiguous, equal targets"]["reads"] = list(seen)
    out["reference equal targets"] = reference(same, ones)
    # 2. The same with ordinary targets and a mask.
    seen.clear()
    out["transposed vs contiguous"] = _run(*mine, ids, mask, group, w1, w2)
    out["transposed vs contiguous"]["reads"] = list(seen)
    out["reference"] = reference(ids, mask)
    # 3. The causal shift view on rank 0, a .contiguous() copy of it on rank 1.
    seen.clear()
    shifted = (lambda: full.clone(), lambda x: x[..., s:e][:, :-1])
    copied = (lambda: full.clone(), lambda x: x[..., s:e][:, :-1].contiguous())
    out["shift vs contiguous"] = _run(*(shifted if rank == 0 else copied), ids[:, 1:],
                                      mask[:, 1:], group, w1[:, :-1], w2[:, :-1])
    out["shift vs contiguous"]["reads"] = list(seen)
    out["reference shift"] = reference(ids[:, 1:], mask[:, 1:], shift=True)
    # 4. Both ranks the causal shift, and both Megatron's transposed layout: read in place.
    for name, layout in (("both shift", shifted), ("both transposed", transposed)):
        seen.clear()
        shift = name == "both shift"
        tail = (lambda x: x[:, 1:]) if shift else (lambda x: x)  # position t predicts t + 1
        head = (lambda x: x[:, :-1]) if shift else (lambda x: x)
        out[name] = _run(*layout, tail(ids), tail(mask), group, head(w1), head(w2))
        out[name]["reads"] = list(seen)
    # 5. Empty micro-batches: both ranks empty; one rank empty, the other not.
    for name, shape in (("empty batch", (0, S, W)), ("empty seq", (B, 0, W))):
        x = torch.zeros(shape, requires_grad=True)
        t = torch.zeros(shape[:-1], dtype=torch.long)
        logp, ent = dt.vocab_parallel_logprobs(x, t, group=group, entropy=True)
        (logp.sum() + ent.sum()).backward()
        out[name] = {"logp": logp.detach(), "entropy": ent.detach(), "grad": x.grad}
    t0 = time.monotonic()
    try:
        x = torch.zeros((0, S, W)) if rank == 0 else full[..., s:e]
        dt.vocab_parallel_logprobs(x, ids[:0] if rank == 0 else ids, group=group)
        out["one rank empty"] = {"error": "no error"}
    except Exception as err:  # noqa: BLE001
        out["one rank empty"] = {"error": f"{type(err).__name__}: {err}"}
    out["one rank empty"]["seconds"] = time.monotonic() - t0
    # The fused lm_head without tokens.
    hidden = torch.zeros(0, H, requires_grad=True)
    weight = torch.randn(W, H).requires_grad_()
    logp, lse = detlogp.fused_linear_logprobs(hidden, weight, torch.zeros(0, dtype=torch.long),
                                              group=group)
    (logp.sum() + lse.sum()).backward()
    out["fused empty"] = {"logp": logp.detach(), "lse": lse.detach(), "grad_hidden": hidden.grad,
                          "grad_weight": weight.grad}
    # The group still works after all of it.
    out["after"] = _run(*contiguous, ids, mask, group, w1, w2)
    return out


def main(rank, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    import torch.distributed as dist

    import detlogp
    from spawn import gloo_rank

    gloo_rank(rank, TP, init_file, out_dir,
              lambda: _scenarios(rank, detlogp.TorchDistributedComm(dist.group.WORLD, timeout=30)))
