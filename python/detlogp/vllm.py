"""vLLM's sampler, replaced by ``detlogp.sample`` (docs/python.md, "vLLM's sampler").

    from detlogp.vllm import DetlogpSampler
    model_runner.sampler = DetlogpSampler()          # in each vLLM worker
    ...
    last = model_runner.sampler.last                 # the last batch: tokens, kept sets, ...

``DetlogpSampler`` is a ``torch.nn.Module`` with the call shape of vLLM's V1 ``Sampler``:
``forward(logits, sampling_metadata, predict_bonus_token=False, logprobs_mode_override=None)``
returns vLLM's ``SamplerOutput`` (``sampled_token_ids`` int32 [rows, 1] and, when the batch
asks for logprobs, ``LogprobsTensors``: ids and logprobs [rows, N + 1], the sampled token first
then the top N, and the sampled tokens' ranks). The tokens are ``detlogp.sample``'s: a function
of the row's logits, its request's seed and its position only, and their logprobs are bitwise
what the trainer's ``vocab_parallel_logprobs`` computes for them. vLLM is not imported at
import time: the metadata is read by its field names (``_vllm_metadata.py``), and the output
classes are ``vllm.v1.outputs``' unless ``outputs=`` gives others.
"""

from typing import NamedTuple

import torch

from . import _vllm_metadata as meta
from ._comm import SelfComm
from ._sample import sample
from .torch import vocab_parallel_logprobs

__all__ = ["DetlogpSampler", "LastBatch"]


class LastBatch(NamedTuple):
    """What ``DetlogpSampler`` sampled last, for the trainer: ``sample`` is ``detlogp.sample``'s
    ``SampleOutput`` (``sample.kept``: each row's kept ids, what ``kept_ids=`` takes), and the
    per-row arguments it was called with: ``seeds`` and ``positions`` int64 [rows],
    ``temperature`` fp32 [rows] (0: greedy), ``top_k`` int32 [rows] and ``top_p`` fp32 [rows]
    (None: no row restricted)."""

    sample: object
    seeds: torch.Tensor
    positions: torch.Tensor
    temperature: torch.Tensor
    top_k: object
    top_p: object


class DetlogpSampler(torch.nn.Module):
    """A drop-in for vLLM's V1 ``Sampler`` that samples with ``detlogp.sample``.

    ``seed``: the seed of rows whose request has no generator (no ``SamplingParams.seed``);
    None: such a row raises (every request must carry its seed). Two unseeded requests share
    this seed, so at the same position on the same logits they draw the same token.
    ``logprobs_mode``: "processed_logprobs" (default: the token's logprob over its kept set
    after temperature, ``SampleOutput.logprobs``) or "raw_logprobs" (vLLM's: the
    full-vocabulary logprob of the unprocessed logits, temperature 1). ``positions_fn``:
    ``positions_fn(sampling_metadata, rows)`` -> each row's position in its request's output,
    when the metadata's ``output_token_ids`` is not filled. ``threads``: as ``detlogp.sample``.
    ``outputs``: a namespace with ``SamplerOutput`` and ``LogprobsTensors`` (default:
    ``vllm.v1.outputs``, imported at the first call).
    """

    def __init__(self, *, seed=None, logprobs_mode="processed_logprobs", positions_fn=None,
                 threads=None, outputs=None):
        super().__init__()
        meta.logprobs_modes(logprobs_mode, None, 1)
        if seed is not None and not -(1 << 63) <= int(seed) < 1 << 64:
            raise meta.refusal("seed", f"seed = {seed} does not fit in 64 bits",
                               "out_of_range")
        self.seed = None if seed is None else meta.as_int64(int(seed))
        self.logprobs_mode = logprobs_mode
        self.positions_fn = positions_fn
        self.threads = threads
        self.outputs = outputs
        self.last = None

    def forward(self, logits, sampling_metadata, predict_bonus_token=False,
                logprobs_mode_override=None, *, positions=None):
        """Samples one token per row of ``logits`` [rows, vocab] (vLLM's: full rows, padding
        trimmed); ``positions`` (int [rows]) overrides ``positions_fn`` and the metadata."""
        md = sampling_metadata
        self.last = None  # never a stale batch's kept sets after a refusal
        meta.refuse_unsupported(md, predict_bonus_token)
        rows, vocab = logits.shape
        if positions is None and self.positions_fn is not None:
            positions = self.positions_fn(md, rows)
        seeds = meta.row_seeds(md, rows, self.seed)
        pos = meta.row_positions(md, rows, positions)
        temperature = meta.row_temperature(md, rows)
        top_k, top_p = meta.row_top_k(md, rows, vocab), meta.row_top_p(md, rows)
        n = meta.num_logprobs(md)
        override = logprobs_mode_override
        if override is None:
            override = getattr(md, "logprobs_mode_override", None)
        modes = meta.logprobs_modes(self.logprobs_mode, override, rows) if n is not None else []
        x = logits.detach()
        if x.device.type != "cpu":  # detlogp.sample reads host memory: one copy, here
            x = x.cpu()
        out = sample(x, seeds, pos, temperature=temperature, top_k=top_k, top_p=top_p,
                     group=SelfComm(), num_logprobs=n or 0, threads=self.threads)
        self.last = LastBatch(out, seeds, pos, temperature, top_k, top_p)
        types = self._output_types()
        tensors = None
        if n is not None:
            ids, lps, ranks = _logprobs_tensors(x, out, temperature, n, modes, self.threads)
            dev = logits.device
            tensors = types.LogprobsTensors(ids.to(device=dev, dtype=torch.int32), lps.to(dev),
                                            ranks.to(dev))
        tokens = out.tokens.to(device=logits.device, dtype=torch.int32)
        return types.SamplerOutput(sampled_token_ids=tokens.view(-1, 1),
                                   logprobs_tensors=tensors)

    def _output_types(self):
        if self.outputs is None:
            try:
                from vllm.v1 import outputs  # vLLM's own classes, where it is installed
            except ImportError as e:
                raise ImportError(
                    f"DetlogpSampler returns vLLM's SamplerOutput from vllm.v1.outputs, which "
                    f"cannot be imported here ({e}); run it in a vLLM worker, or pass outputs= "
                    "(a namespace with SamplerOutput and LogprobsTensors)") from e
            self.outputs = outputs
        return self.outputs


def _logprobs_tensors(logits, out, temperature, n, modes, threads):
    """(ids int64 [rows, n + 1], logprobs fp32 [rows, n + 1], ranks int64 [rows]) on the CPU
    (``logits``: the host copy): the sampled token then the top n, in each row's mode."""
    rows = logits.shape[0]
    parts = {}
    if "processed_logprobs" in modes:
        parts["processed_logprobs"] = _processed(logits, out, temperature, n, threads)
    if "raw_logprobs" in modes:
        parts["raw_logprobs"] = _raw(logits, out, temperature, n, threads)
    pick = torch.tensor([m == "raw_logprobs" for m in modes], dtype=torch.bool)
    if len(parts) == 1:
        return next(iter(parts.values()))
    p, r = parts["processed_logprobs"], parts["raw_logprobs"]
    col = pick.view(rows, 1)
    return (torch.where(col, r[0], p[0]), torch.where(col, r[1], p[1]),
            torch.where(pick, r[2], p[2]))


def _scoring_temperature(temperature):
    """The temperature each row is scored at: its own, 1 for greedy rows (0)."""
    return torch.where(temperature == 0, torch.ones_like(temperature), temperature)


def _restricted(kept, rows):
    """bool [rows]: the rows with a kept set (``kept`` [rows, W]: an unrestricted row is all
    -1; W = 0 or None: no row)."""
    if kept is None or kept.shape[1] == 0:
        return torch.zeros(rows, dtype=torch.bool)
    return kept[:, 0] >= 0


def _ranks(logits, t, tokens, kept=None):
    """vLLM's rank of each row's token: how many ids score at least as high (z = the widened
    logits / t, exact IEEE division as the canon's): among the row's kept set where ``kept``
    [rows, W] (-1 padded) restricts it, else among every column."""
    t = t.view(-1, 1)
    zt = logits.gather(1, tokens.view(-1, 1)).to(torch.float32) / t
    ranks = torch.empty(len(tokens), dtype=torch.int64)
    cut = _restricted(kept, len(tokens))
    full, sub = (~cut).nonzero().view(-1), cut.nonzero().view(-1)
    if len(full):
        ranks[full] = (logits[full].to(torch.float32) / t[full] >= zt[full]).sum(1)
    if len(sub):
        k = kept[sub]
        zk = logits[sub].gather(1, k.clamp(min=0)).to(torch.float32) / t[sub]
        ranks[sub] = ((zk >= zt[sub]) & (k >= 0)).sum(1)
    return ranks


def _first_ids(z, n):
    """Each row's first n ids of the ranking of ``z`` (descending, then id ascending, NaN
    first; what a stable descending sort gives) without sorting whole rows: the ids at or above
    the row's n-th largest value (and any NaN), sorted."""
    rows = z.shape[0]
    if n == 0 or rows == 0:
        return torch.zeros(rows, n, dtype=torch.int64)
    nth = torch.topk(z, n, dim=1).values[:, -1:]
    candidates = (z >= nth) | z.isnan()
    out = []
    for row in range(rows):
        ids = candidates[row].nonzero().view(-1)  # ascending
        order = torch.sort(z[row, ids], descending=True, stable=True).indices[:n]
        out.append(ids[order])
    return torch.stack(out)


def _each(logits, ids, **kw):
    """``vocab_parallel_logprobs`` of every id of ``ids`` [rows, m] against its row (the
    logits read through a stride-0 view, not copied)."""
    rows, m = ids.shape
    if m == 0 or rows == 0:
        return torch.zeros(rows, m, dtype=torch.float32)
    x = logits.unsqueeze(1).expand(rows, m, logits.shape[1])
    return vocab_parallel_logprobs(x, ids, group=SelfComm(), **kw)


def _processed(logits, out, temperature, n, threads):
    """vLLM's processed logprobs: after temperature, renormalised over the kept set. The top n
    are the ranking's first n (a kept set is a prefix of the ranking), with the sampler's
    logprobs on unrestricted rows; ids past a row's kept set score -inf, as vLLM's masked
    logits do."""
    tokens, kept = out.tokens, out.kept
    t = _scoring_temperature(temperature)
    top_ids, top_lp = out.top_ids, out.top_logprobs.clone()
    rows = _restricted(kept, len(tokens)).nonzero().view(-1)
    if len(rows):
        sub = kept[rows]
        top_lp[rows] = _each(logits[rows], top_ids[rows],
                             temperature=t[rows].view(-1, 1).expand(len(rows), n).contiguous(),
                             kept_ids=sub.unsqueeze(1).expand(len(rows), n, sub.shape[1]),
                             outside_kept="neg_inf", threads=threads)
    ids = torch.cat([tokens.view(-1, 1), top_ids], 1)
    lps = torch.cat([out.logprobs.view(-1, 1), top_lp], 1)
    return ids, lps, _ranks(logits, t, tokens, kept)


def _raw(logits, out, temperature, n, threads):
    """vLLM's raw logprobs: full-vocabulary, of the logits as given (temperature 1), the top n
    by the ranking at temperature 1. Rows scored at temperature 1 take the sampler's own
    (``full_logprobs``, ``top_ids``, ``top_logprobs``: the same calls); the others are scored
    here."""
    tokens = out.tokens
    token_lp, top_ids, top_lp = out.full_logprobs.clone(), out.top_ids.clone(), \
        out.top_logprobs.clone()
    rows = (_scoring_temperature(temperature) != 1).nonzero().view(-1)
    if len(rows):
        x = logits[rows]
        token_lp[rows] = vocab_parallel_logprobs(x, tokens[rows], group=SelfComm(),
                                                 threads=threads)
        top_ids[rows] = _first_ids(x.to(torch.float32), n)
        top_lp[rows] = _each(x, top_ids[rows], threads=threads)
    ids = torch.cat([tokens.view(-1, 1), top_ids], 1)
    lps = torch.cat([token_lp.view(-1, 1), top_lp], 1)
    return ids, lps, _ranks(logits, torch.ones(len(tokens)), tokens)
