"""One rank of test_grpo_rollout_train.py: a small GRPO loop whose rollout samples with
``detlogp.sample`` at vLLM's vocabulary layout and whose trainer scores the same tokens with
``vocab_parallel_logprobs`` at Megatron's, four gloo ranks on the CPU.

The toy policy: an embedding E [V, H], an lm_head W [V, H] and per-position scale and shift
A, B [T, H]; the hidden state of a token is ``E[previous token] * A[position] + B[position]``
(two exactly rounded elementwise operations: the same bits in any batch) and its logits are
``detlogp.linear_logits(hidden, W_shard)``, the canonical dot (one fixed order per logit), so
the rollout and the trainer hold the same logit bits whatever their layouts and batches; a
torch matmul's bits depend on the shapes it is called with.

Each loop (rollout TP 3 on ranks 0-2 or TP 4 on ranks 0-3; a "plain" configuration: every
request at temperature 1 over the full vocabulary, in fp32; a "sampling" one: per-request
temperature (greedy rows among them), top-k and top-p, restricted and unrestricted rows mixed,
bf16 logits) runs ITERATIONS times:

- rollout: PROMPTS prompts x SAMPLES requests, T tokens each, autoregressively; request r starts
  at engine step r % LAG, each engine step takes its rows in a shuffled order and in two
  batches of different sizes (so no batch looks like the trainer's); every request has its own
  seed; the logits are sharded at vLLM's bounds (the real vocabulary padded to a multiple of
  64, split evenly: shards of 704 / 528 columns, not multiples of the 128-column tile) and
  passed with their ``vocab_start`` table;
- training, at once: TP 2 on ranks 0-1 and TP 1 on rank 3 (Megatron's bounds: padded to a
  multiple of 128 x TP), all tokens in request order in one batch: their logprobs (restricted
  rows' kept sets recomputed by top_k / top_p on even iterations, the rollout's replayed as
  kept_ids on odd ones; the full vocabulary's too), a GRPO loss (advantages normalised per
  prompt, the clipped ratio to the rollout's logprobs), backward, and the lm_head gradient as
  the canonical dot of the logit gradients and the hidden states (so that it, too, has bits
  independent of the layout); both trainers' gradients are broadcast and every rank takes the
  SGD step of the TP 2 one (the next iteration samples from the updated policy);
- the same tokens scored with plain torch: the rollout gathers full rows to rank 0, trims the
  padding and takes fp32 ``log_softmax`` of its batch; ranks 2-3 run Megatron's vocab-parallel
  log-softmax at TP 2 (max and sum all-reduced) over the trainer's batch; once on the canonical
  logits, once on logits from a torch matmul on each side.

Rank 0 writes the counts (tokens compared, tokens whose bits differ) per loop and pairing."""

import sys

WORLD = 4
V, H = 2083, 64  # vLLM pads to 2112 = 33 x 64: TP 3 shards of 704, TP 4 of 528 columns
PROMPTS, SAMPLES, T, LAG = 32, 8, 12, 4
R = PROMPTS * SAMPLES
ITERATIONS = 9  # 9 x 256 x 12 = 27648 tokens per loop, 110592 over the four loops (104448
# distinct: the TP 3 and TP 4 loops share their first iteration)
LR, CLIP = 4.0, 0.2
CONFIGS = {"plain": 1, "sampling": 2}
LOOPS = [(3, "plain"), (3, "sampling"), (4, "plain"), (4, "sampling")]
TIMEOUT_S = 120


def vllm_bounds(real, tp):
    """vLLM's layout: the vocabulary padded to a multiple of 64, split evenly over tp ranks."""
    import detlogp

    return [tuple(b) for b in detlogp.even_bounds((real + 63) // 64 * 64, tp)]


class Policy:
    """The toy policy (the same initial bits on every rank)."""

    def __init__(self):
        import torch

        g = torch.Generator().manual_seed(20261205)
        self.E = torch.randn(V, H, generator=g)
        self.W = torch.randn(V, H, generator=g) * 0.5  # logits about N(0, 4^2)
        self.A = 1 + 0.2 * torch.randn(T, H, generator=g)
        self.B = 0.2 * torch.randn(T, H, generator=g)
        self.prompt_token = torch.randint(0, V, (PROMPTS,), generator=g)

    def hidden(self, prev, pos):
        return self.E[prev] * self.A[pos] + self.B[pos]

    def shard(self, bounds, rank):
        """This rank's rows of W in a layout: zero rows for the padding."""
        import torch

        s, e = bounds[rank]
        out = torch.zeros(e - s, H)
        real = max(0, min(e, V) - s)
        out[:real] = self.W[s:s + real]
        return out


def request_params(config):
    """Per-request temperature, top_k and top_p of a configuration."""
    import torch

    g = torch.Generator().manual_seed(1000 + CONFIGS[config])
    if config == "plain":
        return {"temperature": torch.ones(R), "top_k": None, "top_p": None}
    temperature = torch.tensor([0.0, 0.6, 1.0, 1.4])[torch.randint(0, 4, (R,), generator=g)]
    top_k = torch.tensor([0, 5, 40, 200])[torch.randint(0, 4, (R,), generator=g)]
    top_p = torch.tensor([1.0, 1.0, 0.9, 0.7])[torch.randint(0, 4, (R,), generator=g)]
    return {"temperature": temperature, "top_k": top_k, "top_p": top_p.float()}


def scoring_temperature(t):
    """Greedy rows (temperature 0) are scored at temperature 1 (vLLM's convention)."""
    import torch

    return torch.where(t == 0, torch.ones_like(t), t)


def restricted_rows(params):
    import torch

    if params["top_k"] is None:
        return torch.zeros(R, dtype=torch.bool)
    return (params["top_k"] > 0) | (params["top_p"] < 1)


def cast(x, config):
    import torch

    return x.to(torch.bfloat16) if config == "sampling" else x


def plain_rollout_logp(full, tokens, t, kept):
    """Plain torch on the rollout side: full rows trimmed to the real vocabulary, fp32
    log_softmax of the batch (ids outside a restricted row's kept set masked to -inf)."""
    import torch

    z = full[:, :V].float() / t[:, None]
    for i, ids in enumerate(kept):
        if ids is not None:
            mask = torch.ones(V, dtype=torch.bool)
            mask[ids] = False
            z[i, mask] = float("-inf")
    return torch.log_softmax(z, -1).gather(1, tokens[:, None])[:, 0]


def rollout(pol, loop, it, config, params, tp, comm, pg, rank):
    """One rollout at vLLM's layout over ranks 0..tp-1; returns rank 0's record."""
    import torch
    import torch.distributed as dist

    import detlogp

    bounds = vllm_bounds(V, tp)
    w_shard = pol.shard(bounds, rank)
    # Per-request seeds (high words nonzero); the first iteration's are the configuration's,
    # so that the TP 3 and TP 4 loops start with the same draws.
    g = torch.Generator().manual_seed(7000 * loop + it if it else CONFIGS[config])
    seeds = torch.randint(0, 2**62, (R,), generator=g)
    g = torch.Generator().manual_seed(9000 * loop + it)  # the engine's batches
    lag = torch.arange(R) % LAG
    rec = {name: torch.zeros(R, T) for name in ("logp", "full_logp", "plain", "plain_mm")}
    tokens = torch.full((R, T), -1, dtype=torch.int64)
    kept = [[None] * T for _ in range(R)]
    t_req = params["temperature"]
    for step in range(T + LAG - 1):
        order = torch.randperm(R, generator=g)
        rows = order[((step - lag[order]) >= 0) & ((step - lag[order]) < T)]
        cut = int(torch.randint(1, len(rows), (1,), generator=g))
        for sub in (rows[:cut], rows[cut:]):
            pos = step - lag[sub]
            prev = torch.where(pos == 0, pol.prompt_token[sub // SAMPLES],
                               tokens[sub, (pos - 1).clamp_min(0)])
            hid = pol.hidden(prev, pos)
            logits = cast(detlogp.linear_logits(hid, w_shard), config)
            kw = {}
            if params["top_k"] is not None:
                kw = {"top_k": params["top_k"][sub], "top_p": params["top_p"][sub]}
            out = detlogp.sample(logits, seeds[sub], pos, temperature=t_req[sub], group=comm,
                                 real_vocab=V, vocab_start=bounds, **kw)
            tokens[sub, pos] = out.tokens
            rec["logp"][sub, pos] = out.logprobs
            rec["full_logp"][sub, pos] = out.full_logprobs
            row_kept = [None] * len(sub)
            for i, r in enumerate(sub.tolist()):
                if out.kept.shape[1] and out.kept[i, 0] >= 0:
                    row_kept[i] = out.kept[i][out.kept[i] >= 0].clone()
                kept[r][int(pos[i])] = row_kept[i]
            # Plain torch: the rows gathered to rank 0 (canonical and matmul logits).
            both = torch.stack([logits, cast(hid @ w_shard.T, config)]).contiguous()
            parts = [torch.empty_like(both) for _ in range(tp)] if rank == 0 else None
            dist.gather(both, parts, dst=0, group=pg)
            if rank == 0:
                full = torch.cat(parts, -1)
                t = scoring_temperature(t_req[sub])
                rec["plain"][sub, pos] = plain_rollout_logp(full[0], out.tokens, t, row_kept)
                rec["plain_mm"][sub, pos] = plain_rollout_logp(full[1], out.tokens, t, row_kept)
    rec["tokens"], rec["kept"] = tokens, kept
    return rec


def padded_kept(kept, rows):
    """The kept sets of the given (request, position) pairs as a -1 padded int64 tensor."""
    import torch

    sets = [kept[r][p] for r, p in rows]  # None: an unrestricted row (all -1 here)
    width = max(len(s) for s in sets if s is not None)
    out = torch.full((len(sets), width), -1, dtype=torch.int64)
    for i, s in enumerate(sets):
        if s is not None:
            out[i, :len(s)] = s
    return out


def rows_differ(a, b):
    """How many rows of two -1 padded id tables (any widths) hold different ids."""
    import torch.nn.functional as F

    width = max(a.shape[1], b.shape[1])
    a = F.pad(a, (0, width - a.shape[1]), value=-1)
    b = F.pad(b, (0, width - b.shape[1]), value=-1)
    return int((a != b).any(1).sum())


def oracle_excess(logits, targets, t_tok, logp, r_idx, kept):
    """The largest |logp - float64 oracle| over its bound (docs/numerics.md, "Accuracy of
    logp" and "Kept sets": 1e-5 + 4e-6 |LSE| + half an ulp of LSE and of logp, here bounded by
    1e-5 + 5e-6 (|LSE| + |logp|)), the oracle the log-softmax of each token's scored values
    (fp32 logits / temperature, then float64) over its kept set or the real vocabulary."""
    import torch

    z = (logits[:, :V].float() / t_tok[:, None]).double()
    if kept is not None:
        keep = torch.zeros(len(r_idx), V + 1, dtype=torch.bool)
        keep.scatter_(1, torch.where(kept >= 0, kept, V), True)
        z[r_idx] = z[r_idx].masked_fill(~keep[:, :V], float("-inf"))
    lse = torch.logsumexp(z, -1)
    oracle = z.gather(1, targets[:, None])[:, 0] - lse
    bound = 1e-5 + 5e-6 * (lse.abs() + oracle.abs())
    return float(((logp.double() - oracle).abs() / bound).max())


def trainer_batch(pol, tokens, params):
    """The trainer's batch of the rollout's tokens [R, T], one row per token in request order:
    the hidden states (from each token's predecessor and position), the targets and each row's
    scoring temperature."""
    import torch

    prev = torch.cat([pol.prompt_token.repeat_interleave(SAMPLES)[:, None], tokens[:, :-1]], 1)
    pos = torch.arange(T).expand(R, T)
    hid = pol.hidden(prev.reshape(-1), pos.reshape(-1))
    t_tok = scoring_temperature(params["temperature"]).repeat_interleave(T)
    return hid, tokens.reshape(-1), t_tok


def train(pol, rec, config, params, it, tp, comm, rank):
    """One trainer step at Megatron's layout: the logprobs of the rollout's tokens (restricted
    rows: kept sets recomputed by top_k / top_p on even iterations, the rollout's replayed as
    kept_ids on odd ones), the GRPO loss, backward, this layout's full lm_head gradient."""
    import torch
    import torch.distributed as dist

    import detlogp
    import detlogp.torch as dt

    _, bounds = detlogp.megatron_bounds(V, tp)
    w_shard = pol.shard(bounds, rank)
    tokens = rec["tokens"]
    hid, targets, t_tok = trainer_batch(pol, tokens, params)
    restricted = restricted_rows(params).repeat_interleave(T)
    logits = cast(detlogp.linear_logits(hid, w_shard), config).requires_grad_()
    kw = {"group": comm, "real_vocab": V}
    r_idx = restricted.nonzero().flatten()
    got = {}
    given = None
    # One call for the whole batch, as the rollout sampled it: restricted rows over their kept
    # sets, unrestricted rows (top_k 0 and top_p 1, or an all -1 kept row with
    # empty_kept="full") over the full vocabulary.
    if not len(r_idx):
        logp = dt.vocab_parallel_logprobs(logits, targets, temperature=t_tok, **kw)
    else:
        given = padded_kept(rec["kept"], [(i // T, i % T) for i in range(R * T)])
        if it % 2 == 0:
            logp, sets = dt.vocab_parallel_logprobs(
                logits, targets, temperature=t_tok, top_k=params["top_k"].repeat_interleave(T),
                top_p=params["top_p"].repeat_interleave(T), return_kept=True, **kw)
            got["kept_differ"] = rows_differ(sets, given)  # the sampler's sets, recomputed
        else:
            logp = dt.vocab_parallel_logprobs(logits, targets, temperature=t_tok,
                                              kept_ids=given, empty_kept="full", **kw)
    with torch.no_grad():
        full = dt.vocab_parallel_logprobs(logits.detach(), targets, temperature=t_tok, **kw)
    if tp == 1:
        got["oracle_excess"] = oracle_excess(logits.detach(), targets, t_tok, logp.detach(),
                                             r_idx, given[r_idx] if len(r_idx) else None)
    # GRPO: per-request reward (the share of tokens in the first quarter of the vocabulary),
    # advantages normalised within each prompt's group, the clipped ratio to the rollout.
    reward = (tokens < V // 4).float().mean(1).reshape(PROMPTS, SAMPLES)
    adv = (reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-4)
    adv = adv.reshape(-1).repeat_interleave(T)
    ratio = torch.exp(logp - rec["logp"].reshape(-1))
    objective = torch.minimum(ratio * adv, ratio.clamp(1 - CLIP, 1 + CLIP) * adv)
    (-objective.mean()).backward()
    # dL/dW = dL/dlogits^T . hidden, as canonical dots (layout-independent bits).
    grad_shard = detlogp.linear_logits(logits.grad.float().T.contiguous(), hid.T.contiguous())
    if tp > 1:
        parts = [torch.empty_like(grad_shard) for _ in range(tp)]
        dist.all_gather(parts, grad_shard, group=comm.group)
        grad_shard = torch.cat(parts)
    got.update(logp=logp.detach().reshape(R, T), full=full.reshape(R, T),
               grad=grad_shard[:V].contiguous(), ratio_not_one=int((ratio != 1).sum()))
    return got


def plain_train_logp(pol, rec, config, params, pg, rank):
    """Plain torch at Megatron's TP 2 layout (ranks 2-3): Megatron's vocab-parallel
    log-softmax, max and sum all-reduced, over the trainer's batch, on the canonical logits
    and on a torch matmul's."""
    import torch
    import torch.distributed as dist

    import detlogp

    _, bounds = detlogp.megatron_bounds(V, 2)
    s, e = bounds[rank]
    w_shard = pol.shard(bounds, rank)
    tokens = rec["tokens"]
    hid, targets, t_tok = trainer_batch(pol, tokens, params)
    outside = torch.zeros(R * T, e - s, dtype=torch.bool)
    outside[:, max(0, V - s):] = True  # padding
    for i in restricted_rows(params).repeat_interleave(T).nonzero().flatten().tolist():
        ids = rec["kept"][i // T][i % T]
        row = torch.ones(e - s, dtype=torch.bool)
        local = ids[(ids >= s) & (ids < e)] - s
        row[local] = False
        outside[i] |= row
    out = {}
    for name, logits in (("plain", detlogp.linear_logits(hid, w_shard)),
                         ("plain_mm", hid @ w_shard.T)):
        z = cast(logits, config).float() / t_tok[:, None]
        z = z.masked_fill(outside, float("-inf"))
        m = z.max(-1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=pg)
        z = z - m[:, None]
        sum_exp = z.exp().sum(-1)
        dist.all_reduce(sum_exp, group=pg)
        mine = (targets >= s) & (targets < e)
        target_z = torch.where(mine, z.gather(1, (targets - s).clamp(0, e - s - 1)[:, None])[:, 0],
                               torch.zeros(()))
        dist.all_reduce(target_z, group=pg)
        out[name] = (target_z - torch.log(sum_exp)).reshape(R, T)
    return out


def differ(a, b):
    """How many entries of two fp32 tensors differ in any bit."""
    import torch

    return int((a.view(torch.int32) != b.view(torch.int32)).sum())


def run_loop(loop, tp_rollout, config, rank, comms, groups):
    import torch
    import torch.distributed as dist

    pol = Policy()
    params = request_params(config)
    counts = {"tokens": 0, "iterations": 0, "updates_differ": 0, "rollout_ranks_differ": 0,
              "ratio_not_one": 0, "kept_differ": 0, "plain": 0, "plain_mm": 0,
              "restricted_tokens": 0, "recomputed_tokens": 0, "replayed_tokens": 0,
              "greedy_tokens": 0, "oracle_excess": 0.0}
    for tp_train in (1, 2):
        for what in ("logp", "full"):
            counts[f"tp{tp_train} {what}"] = 0
    rewards = []
    for it in range(ITERATIONS):
        rec = None
        if rank < tp_rollout:
            key = f"tp{tp_rollout}"
            rec = rollout(pol, loop, it, config, params, tp_rollout, comms[key], groups[key],
                          rank)
        # Rank 0's record to every rank; rollout ranks check they drew the same tokens.
        box = [rec if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        mine, rec = rec, box[0]
        ranks_differ = torch.zeros(1, dtype=torch.int64)
        if mine is not None and rank != 0:
            ranks_differ += int((mine["tokens"] != rec["tokens"]).sum())
            ranks_differ += differ(mine["logp"], rec["logp"]) + differ(mine["full_logp"],
                                                                      rec["full_logp"])
        got = plain = None
        if rank in (0, 1):
            got = train(pol, rec, config, params, it, 2, comms["tp2"], rank)
        if rank == 3:
            import detlogp

            got = train(pol, rec, config, params, it, 1, detlogp.SelfComm(), 0)
        if rank in (2, 3):
            plain = plain_train_logp(pol, rec, config, params, groups["train plain"], rank - 2)
        # The two trainers' results (TP 2 from rank 0, TP 1 from rank 3) and the plain
        # torch trainer's (rank 2) to every rank.
        box = [got if rank == 0 else None, got if rank == 3 else None,
               plain if rank == 2 else None]
        for src in (0, 3, 2):
            one = [box[(0, 3, 2).index(src)]]
            dist.broadcast_object_list(one, src=src)
            box[(0, 3, 2).index(src)] = one[0]
        tp2, tp1, plain = box
        dist.all_reduce(ranks_differ)
        counts["rollout_ranks_differ"] += int(ranks_differ)
        counts["updates_differ"] += differ(tp1["grad"], tp2["grad"])
        counts["oracle_excess"] = max(counts["oracle_excess"], tp1["oracle_excess"])
        for tp_train, res in ((1, tp1), (2, tp2)):
            counts[f"tp{tp_train} logp"] += differ(res["logp"], rec["logp"])
            counts[f"tp{tp_train} full"] += differ(res["full"], rec["full_logp"])
            counts["ratio_not_one"] += res["ratio_not_one"]
            counts["kept_differ"] += res.get("kept_differ", 0)
        counts["plain"] += differ(plain["plain"], rec["plain"])
        counts["plain_mm"] += differ(plain["plain_mm"], rec["plain_mm"])
        counts["tokens"] += R * T
        restricted = int(restricted_rows(params).sum()) * T
        counts["restricted_tokens"] += restricted
        counts["recomputed_tokens" if it % 2 == 0 else "replayed_tokens"] += restricted
        counts["greedy_tokens"] += int((params["temperature"] == 0).sum()) * T
        counts["iterations"] += 1
        rewards.append(float((rec["tokens"] < V // 4).float().mean()))
        pol.W = pol.W - LR * tp2["grad"]  # the same SGD step on every rank
        if it == 0:
            counts["first"] = {"tokens": rec["tokens"], "logp": rec["logp"], "W": pol.W}
    counts["reward"] = rewards
    return counts


def _scenarios(rank):
    import torch.distributed as dist

    import detlogp

    groups = {"tp3": dist.new_group([0, 1, 2]), "tp4": dist.group.WORLD,
              "tp2": dist.new_group([0, 1]), "train plain": dist.new_group([2, 3])}
    comms = {name: detlogp.TorchDistributedComm(groups[name], timeout=TIMEOUT_S)
             for name, members in (("tp3", (0, 1, 2)), ("tp4", (0, 1, 2, 3)), ("tp2", (0, 1)))
             if rank in members}
    out = {}
    for loop, (tp_rollout, config) in enumerate(LOOPS):
        counts = run_loop(loop, tp_rollout, config, rank, comms, groups)
        out[f"tp{tp_rollout} {config}"] = counts
    return out


def main(rank, init_file, out_dir, tests_dir):
    sys.path.insert(0, tests_dir)
    from spawn import gloo_rank

    gloo_rank(rank, WORLD, init_file, out_dir, lambda: _scenarios(rank))
