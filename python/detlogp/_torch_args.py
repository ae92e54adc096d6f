"""The per-token arguments of the torch API, read one way by every entry point that takes them
(``detlogp.torch.vocab_parallel_logprobs`` on logits, ``fused_vocab_parallel_logprobs`` on
hidden states): targets of the leading shape, the active mask (``loss_mask`` and
``ignore_index``), per-token temperatures, the vocab bounds table (``vocab_start``, any
contiguous partition: both calls accept bounds off the tiles) and the real vocabulary.

``width`` names where a rank's vocab width comes from in the errors: ``logits.shape[-1]`` for
logits, ``weight.shape[0]`` for the lm_head weight shard of the fused call.
"""

import numpy as np
import torch

from ._checks import check_int, check_optional_int
from ._contract import _temperature, megatron_padded_vocab
from ._detlogp import LogprobContractError
from ._mask import active_from_mask, mask_array
from ._ops import is_plain

__all__ = ["vocab_bounds", "real_vocab_size", "int_targets", "active_tokens",
           "token_temperature", "op_targets", "op_mask", "op_vocab_start", "op_temperature"]

# width -> (what holds the vocabulary, what to pass instead, what the width is)
_WHAT = {"logits.shape[-1]": ("the logits", "logits", "the logits' width"),
         "weight.shape[0]": ("the lm_head weight shards", "an lm_head weight",
                             "the weight shard's rows")}


def vocab_bounds(vocab_start, cols, tp, rank):
    """(bounds, padded): Megatron's equal shards of ``cols`` columns unless given."""
    if vocab_start is None or not isinstance(vocab_start, (list, tuple)):
        if vocab_start is not None:
            start = check_int(vocab_start, "vocab_start", "non-negative")
            if start != rank * cols:
                raise LogprobContractError(
                    f"vocab_start={start} does not match equal shards of {cols} columns (rank "
                    f"{rank} starts at {rank * cols}); for unequal shards pass vocab_start as "
                    "the full table [(start, end), ...] of every rank")
        return tuple((k * cols, (k + 1) * cols) for k in range(tp)), cols * tp
    bounds = tuple((check_int(s, "vocab_start bound"), check_int(e, "vocab_start bound"))
                   for s, e in vocab_start)
    if len(bounds) != tp:
        raise LogprobContractError(
            f"vocab_start lists {len(bounds)} shards but the group has {tp} ranks")
    return bounds, bounds[-1][1]


def real_vocab_size(real_vocab, padded, cols, tp, inferred, width="logits.shape[-1]"):
    """``real_vocab`` checked against the vocabulary the logits hold (default: all of it)."""
    if real_vocab is None:
        return padded
    real = check_int(real_vocab, "real_vocab", "positive")
    if real > padded and not inferred:
        raise LogprobContractError(
            f"real_vocab={real} is larger than the vocabulary of the vocab_start table, which "
            f"ends at column {padded}; pass real_vocab <= {padded} (the number of real, "
            "unpadded tokens) or a table that covers the whole padded vocabulary")
    if real > padded:
        holder, one, local = _WHAT[width]
        try:
            fit = megatron_padded_vocab(real, tp)
            fix = (f"; or, if real_vocab={real} is right, pass {one} of the whole padded "
                   f"vocabulary: detlogp.megatron_padded_vocab({real}, {tp}) = {fit} columns "
                   f"({fit // tp} per rank)")
        except LogprobContractError:
            fix = ""
        raise LogprobContractError(
            f"real_vocab={real} is larger than the vocabulary {holder} hold: {cols} columns "
            f"({width}) x {tp} TP rank(s) = {padded}, the padded vocabulary inferred "
            f"from {local} and the group's size. Pass real_vocab <= {padded} (the "
            f"number of real, unpadded tokens){fix}")
    return real


def int_targets(targets, lead_shape, what="the logits'"):
    """``targets`` (of ``lead_shape``: ``what`` leading shape) as a flat int64 CPU tensor."""
    if not isinstance(targets, torch.Tensor):
        targets = torch.as_tensor(np.asarray(targets))
    if targets.dtype.is_floating_point or targets.dtype.is_complex or \
            targets.dtype == torch.bool:
        raise LogprobContractError(f"targets must hold integers; got dtype {targets.dtype}")
    if tuple(targets.shape) != lead_shape:
        raise LogprobContractError(
            f"targets must have {what} leading shape {lead_shape}; got "
            f"{tuple(targets.shape)}")
    return targets.detach().reshape(-1).to(device="cpu", dtype=torch.int64)


def active_tokens(flat_targets, loss_mask, ignore_index, lead_shape):
    """The per-token active mask (bool, CPU): loss_mask != 0 and targets != ignore_index."""
    active = None
    if ignore_index is not None:
        active = flat_targets != check_int(ignore_index, "ignore_index")
    if loss_mask is not None:
        lm = active_from_mask(loss_mask, lead_shape, "loss_mask",
                              f"the targets' shape {lead_shape}")
        lm = lm if isinstance(lm, torch.Tensor) else torch.from_numpy(lm)
        active = lm if active is None else active & lm
    if active is None:
        active = torch.ones(flat_targets.shape, dtype=torch.bool)
    return active


def token_temperature(temperature, lead_shape):
    """A tensor of per-token temperatures (the targets' shape, floating point) as fp32 on the
    CPU in token order; its values are checked by the operator on every rank."""
    if not temperature.dtype.is_floating_point:
        raise LogprobContractError(
            f"temperature must be a number or a floating-point tensor; got dtype "
            f"{temperature.dtype}")
    if tuple(temperature.shape) != lead_shape:
        raise LogprobContractError(
            f"a temperature tensor must have the targets' shape {lead_shape} (one per token); "
            f"got {tuple(temperature.shape)}")
    return temperature.detach().reshape(-1).to(device="cpu", dtype=torch.float32)


# --- the arguments in the custom ops' schema types (before the op: traced by torch.compile) ---


def op_targets(targets, lead_shape, what="the logits'"):
    """``targets`` as the op takes them: a plain tensor as it is, anything else (a list, a
    NumPy array, a meta or sparse tensor) read once as int64 of ``lead_shape``."""
    if isinstance(targets, torch.Tensor) and is_plain(targets):
        return targets
    return int_targets(targets, lead_shape, what).view(lead_shape)


def op_mask(loss_mask):
    """``loss_mask`` as the op takes it: None or a plain tensor (a NumPy array or list is read
    once; a sparse tensor made dense)."""
    if loss_mask is not None and not isinstance(loss_mask, torch.Tensor):
        return torch.from_numpy(mask_array(loss_mask, "loss_mask"))
    if loss_mask is not None and not is_plain(loss_mask):
        return loss_mask.detach().to_dense().cpu()
    return loss_mask


def op_vocab_start(vocab_start):
    """(vocab_start, bounds) of the op: this rank's first column or None, and the table
    [(start, end), ...] flattened or None."""
    if isinstance(vocab_start, (list, tuple)):
        return None, [check_int(v, "vocab_start bound") for s, e in vocab_start for v in (s, e)]
    return check_optional_int(vocab_start, "vocab_start", "non-negative"), None


def op_temperature(temperature):
    """(scalar, per-token tensor or None) of the op: a tensor gives each token its own (the
    scalar is then 1)."""
    if isinstance(temperature, torch.Tensor):
        return 1.0, temperature
    return _temperature(temperature), None
