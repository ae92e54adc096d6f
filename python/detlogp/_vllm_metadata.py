"""vLLM's sampling metadata read as ``detlogp.sample``'s per-row arguments, for the sampler
replacement ``detlogp.vllm.DetlogpSampler`` (docs/python.md, "vLLM's sampler").

Duck-typed on the fields of vLLM's V1 ``SamplingMetadata`` (``vllm/v1/sample/metadata.py``):
nothing here imports vLLM. What the canon cannot honour (penalties, allowed-token and bad-word
masks, active min-p / logit-bias / min-tokens processors, any other logits processor,
speculative decoding's bonus tokens, full-vocabulary logprobs) raises LogprobContractError
naming the field and the fix: a request is never sampled with a parameter silently dropped.
"""

import torch

from ._detlogp import LogprobContractError

__all__ = ["GREEDY_EPS", "MODES", "refusal", "as_int64", "refuse_unsupported", "row_seeds",
           "row_positions", "row_temperature", "row_top_k", "row_top_p", "num_logprobs",
           "logprobs_modes"]

# vLLM's _SAMPLING_EPS: a request whose temperature is below it is sampled greedily.
GREEDY_EPS = 1e-5
MODES = ("processed_logprobs", "raw_logprobs")

# vLLM's built-in logits processors, which sit in every batch's ``logitsprocs`` whether or not
# a request uses them: the attribute that is empty (falsy) when none does, and the
# SamplingParams field a request sets to use it.
_BUILTIN = {"MinPLogitsProcessor": ("min_p_count", "min_p"),
            "LogitBiasLogitsProcessor": ("biases", "logit_bias"),
            "MinTokensLogitsProcessor": ("min_toks", "min_tokens")}


def refusal(field, message, code="not_supported"):
    """A LogprobContractError with ``code`` and ``field`` set, as the C++ errors carry them."""
    error = LogprobContractError(message)
    error.code, error.field = code, field
    return error


def as_int64(value):
    """A 64-bit seed (a Python int in [-2^63, 2^64)) as the int64 of the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _refuse(field, what):
    return refusal(field, f"DetlogpSampler cannot honour {what} ({field}): the deterministic "
                   "sampler draws from the model's logits with temperature, top_k and top_p "
                   "only; send this request without it, or sample it with vLLM's own sampler")


def refuse_unsupported(md, predict_bonus_token):
    """Raises on the first thing in the metadata ``md`` the canon cannot honour."""
    if predict_bonus_token:
        raise _refuse("predict_bonus_token", "speculative decoding's bonus tokens")
    if getattr(md, "allowed_token_ids_mask", None) is not None:
        raise _refuse("allowed_token_ids_mask", "an allowed-token-ids mask")
    if getattr(md, "bad_words_token_ids", None):
        raise _refuse("bad_words_token_ids", "bad words")
    if not getattr(md, "no_penalties", True):
        raise _refuse("presence_penalties",
                      "presence, frequency or repetition penalties (no_penalties is False)")
    # Older metadata carried these as fields instead of processors.
    min_p = getattr(md, "min_p", None)
    if min_p is not None and bool(torch.as_tensor(min_p).ne(0).any()):
        raise _refuse("min_p", "min_p")
    if any(b for b in getattr(md, "logit_bias", None) or ()):
        raise _refuse("logit_bias", "a logit bias")
    if getattr(md, "min_tokens", None):
        raise _refuse("min_tokens", "min_tokens")
    procs = getattr(md, "logitsprocs", None)
    if procs is None:
        return
    for proc in (list(getattr(procs, "non_argmax_invariant", ())) +
                 list(getattr(procs, "argmax_invariant", ()))):
        name = type(proc).__name__
        if name not in _BUILTIN:
            raise _refuse("logitsprocs", f"the logits processor {name}")
        attr, field = _BUILTIN[name]
        if getattr(proc, attr):
            raise _refuse(field, f"{field} (vLLM's {name} is active in this batch)")


def _check_rows(value, field, rows):
    if value.dim() != 1 or value.shape[0] != rows:
        raise refusal(field, f"{field} must hold one value per logits row ({rows}); got shape "
                      f"{tuple(value.shape)}", "wrong_shape")
    return value


def row_seeds(md, rows, default_seed):
    """int64 [rows]: a row's seed is its request's generator's ``initial_seed()`` (the
    request's SamplingParams.seed; the 64 bits as int64), else ``default_seed``."""
    generators = getattr(md, "generators", None) or {}
    seeds = []
    for row in range(rows):
        gen = generators.get(row)
        if gen is not None:
            seeds.append(as_int64(int(gen.initial_seed())))
        elif default_seed is not None:
            seeds.append(default_seed)
        else:
            raise refusal(
                "generators", f"row {row} has no seed: generators has no generator for it "
                "(its request has no SamplingParams.seed) and DetlogpSampler was built without "
                "seed=; give every request a seed, or build DetlogpSampler(seed=...)", "empty")
    return torch.tensor(seeds, dtype=torch.int64)


def row_positions(md, rows, positions):
    """int64 [rows]: ``positions`` when given, else the length of each row's
    ``output_token_ids`` (the tokens its request has generated so far)."""
    if positions is not None:
        return _check_rows(torch.as_tensor(positions).to(torch.int64).cpu(), "positions", rows)
    out = getattr(md, "output_token_ids", None)
    if out is None or len(out) != rows:
        got = "none" if out is None else f"{len(out)} lists"
        raise refusal(
            "positions", f"no positions: the metadata's output_token_ids has {got} for {rows} "
            "rows (vLLM fills it only when penalties or processors need it); pass "
            "positions= (each row's index in its request's output) to forward or a "
            "positions_fn to DetlogpSampler", "empty")
    return torch.tensor([len(o) for o in out], dtype=torch.int64)


def row_temperature(md, rows):
    """fp32 [rows]: each row's temperature, 0 for greedy rows (vLLM's rule: below
    GREEDY_EPS, or every row when all_greedy)."""
    if getattr(md, "all_greedy", False):
        return torch.zeros(rows, dtype=torch.float32)
    t = getattr(md, "temperature", None)
    if t is None:
        raise refusal("temperature", "temperature is None but all_greedy is False; vLLM "
                      "gives a temperature per row unless every row is greedy", "empty")
    t = _check_rows(torch.as_tensor(t).detach().to(torch.float32).cpu(), "temperature", rows)
    return torch.where(t < GREEDY_EPS, torch.zeros_like(t), t)


def row_top_k(md, rows, vocab):
    """int32 [rows] (0 = off; vLLM marks off as the vocabulary size), or None if no row is
    restricted."""
    k = getattr(md, "top_k", None)
    if k is None:
        return None
    k = _check_rows(torch.as_tensor(k).detach().to(torch.int64).cpu(), "top_k", rows)
    k = torch.where((k <= 0) | (k >= vocab), torch.zeros_like(k), k).to(torch.int32)
    return k if bool(k.ne(0).any()) else None


def row_top_p(md, rows):
    """fp32 [rows] (1 = off), or None if no row is restricted."""
    p = getattr(md, "top_p", None)
    if p is None:
        return None
    p = _check_rows(torch.as_tensor(p).detach().to(torch.float32).cpu(), "top_p", rows)
    p = torch.where(p >= 1, torch.ones_like(p), p)
    return p if bool(p.ne(1).any()) else None


def num_logprobs(md):
    """The N of the top-N logprobs (0: the sampled token's only), or None: no logprobs."""
    n = getattr(md, "max_num_logprobs", None)
    if n is None:
        return None
    n = int(n)
    if n < 0:
        raise _refuse("max_num_logprobs", f"max_num_logprobs = {n} (every id's logprob)")
    return n


def logprobs_modes(mode, override, rows):
    """Each row's logprobs mode, a list of MODES: ``override`` (one mode, or one per row
    with None for ``mode``) when given, else ``mode``."""
    modes = [mode] * rows
    if isinstance(override, str):
        modes = [override] * rows
    elif override is not None:
        if len(override) != rows:
            raise refusal("logprobs_mode_override", f"logprobs_mode_override lists "
                          f"{len(override)} modes for {rows} rows", "wrong_shape")
        modes = [mode if m is None else m for m in override]
    for row, m in enumerate(modes):
        if m not in MODES:
            raise refusal("logprobs_mode", f"logprobs_mode {m!r} (row {row}) is not "
                          f"supported; use one of {', '.join(MODES)}", "invalid_enum")
    return modes
