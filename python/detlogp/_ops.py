"""detlogp's torch.library custom ops: what ``torch.compile`` sees of a call.

``detlogp.torch.vocab_parallel_logprobs`` (and the drop-ins on it) and
``fused_linear_logprobs`` on torch tensors run as the ops ``detlogp::vocab_parallel_logprobs``
and ``detlogp::fused_linear_logprobs``, eager or compiled alike. Each op is opaque to the
compiler: its implementation is the package's one call path (a ``_Prepared`` call of
detlogp/torch.py or a ``_FusedCall`` of detlogp/_fused.py, run by _call.py), its fake
implementation gives the outputs' shapes, dtypes and strides from the inputs' alone, and its
autograd formula calls the matching backward op. Every argument is a schema type: tensors, the
process group by name (``group.group_name``, resolved inside the op as torch's functional
collectives do; "" for one rank) and the options as ints, floats, bools and strings. The
collectives run inside the ops (forward and backward), so a compiled graph holds no
communication of its own.

The state backward needs (the C++ forward's handle) stays in Python, held by the op's last
output: a one-byte uint8 tensor whose storage owns it (``_save``). Autograd saves that tensor
with the logits; backward finds the state through it, and the state is freed with it (after
backward, or with the graph when backward never runs). The outputs never alias the inputs or
each other: logp, LSE and entropy are fresh, and a gradient comes from the pool of
detlogp/_call_cache.py, which hands a buffer out again only once no tensor refers to it.
"""

import weakref
from typing import Optional

import numpy as np
import torch
import torch._dynamo  # noqa: F401 - see below
from torch import Tensor

from ._comm import Communicator, SelfComm
from ._detlogp import LogprobContractError
from ._names import name_of, named

__all__ = ["vocab_parallel_logprobs", "fused_linear_logprobs", "group_name", "group_of",
           "is_plain", "call_of"]

# torch._dynamo is imported above, with detlogp.torch, rather than by torch at the first call of
# a custom op: it imports torch.distributed.nn.functional, whose functions take
# ``group=group.WORLD`` as a default evaluated at import. Imported after a trainer's
# init_process_group, those defaults would hold the world group, alive after
# destroy_process_group (tests/python/test_group_lifetime.py).


def is_plain(t):
    """A tensor an op call takes as it is: strided, on the CPU or a CUDA device. Any other
    (meta, sparse) is read the way the call's checks read it before the op, so that it raises
    while the call prepares (failing the peers) instead of reaching the op's fake or missing
    kernel."""
    return t.layout == torch.strided and t.device.type in ("cpu", "cuda")


def group_name(group):
    """The op argument of a resolved group: "" for one rank (None, SelfComm), the name of a
    torch.distributed process group (as torch's functional collectives pass it), or a name for
    another detlogp Communicator (eager only)."""
    if group is None or isinstance(group, SelfComm):
        return ""
    if isinstance(group, Communicator):
        if torch.compiler.is_compiling():
            raise LogprobContractError(
                f"group={type(group).__name__}: under torch.compile, group= takes a "
                "torch.distributed process group, None or detlogp.SelfComm()")
        return name_of(group, "comm")
    return group.group_name


def group_of(name):
    """The group of an op's ``group`` argument: None (one rank, ""), a detlogp Communicator
    (named by ``name_of``) or the torch.distributed process group of that name."""
    if not name:
        return None
    if name.startswith("detlogp-"):
        return named(name)
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


# --- the state backward needs --------------------------------------------------------------

_SAVED = {}  # address of a saved-state tensor's byte -> the call its backward needs


def _save(call):
    """A fresh uint8 tensor [1] whose storage keeps ``call`` for backward (module docstring)."""
    owner = np.zeros(1, dtype=np.uint8)
    key = owner.ctypes.data
    _SAVED[key] = call
    weakref.finalize(owner, _SAVED.pop, key, None)
    return torch.from_numpy(owner)


def _saved_call(saved):
    call = _SAVED.get(saved.data_ptr())
    if call is None:
        raise RuntimeError(
            "detlogp: backward got a saved-state tensor that no forward made (a copy of the "
            "op's last output?); pass the tensor the forward returned")
    return call


def call_of(saved):
    """The call object behind an op's saved-state output (its ``contract``, for one)."""
    return _saved_call(saved)


def _saved_like(x):
    return x.new_empty((1,), dtype=torch.uint8, device="cpu")


# --- detlogp::vocab_parallel_logprobs ------------------------------------------------------


@torch.library.custom_op("detlogp::vocab_parallel_logprobs", mutates_args=())
def vocab_parallel_logprobs(
        logits: Tensor, targets: Tensor, loss_mask: Optional[Tensor], group: str,
        real_vocab: Optional[int], ignore_index: Optional[int], temperature: float,
        entropy: bool, deterministic: bool, vocab_start: Optional[int],
        vocab_bounds: Optional[list[int]], threads: Optional[int], tile_width: Optional[int],
        entropy_grad: bool, cache: str, softcap: Optional[float],
        row_temperature: Optional[Tensor] = None, kept_ids: Optional[Tensor] = None,
        outside_neg_inf: bool = False, top_k: Optional[Tensor] = None,
        top_p: Optional[Tensor] = None,
        empty_kept_full: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """(logp, entropy or an empty tensor, saved state) of ``detlogp.torch``'s call."""
    from . import torch as api

    call = api._op_call(logits, targets, loss_mask, group, real_vocab, ignore_index,
                        temperature, entropy, deterministic, vocab_start, vocab_bounds,
                        threads, tile_width, entropy_grad, cache, softcap, row_temperature,
                        kept_ids, outside_neg_inf, top_k, top_p, empty_kept_full)
    outputs = call.forward((logits,))
    ent = outputs[1] if entropy else torch.zeros(0, dtype=torch.float32, device=logits.device)
    return outputs[0], ent, _save(call)


@vocab_parallel_logprobs.register_fake
def _(logits, targets, loss_mask, group, real_vocab, ignore_index, temperature, entropy,
      deterministic, vocab_start, vocab_bounds, threads, tile_width, entropy_grad, cache,
      softcap, row_temperature=None, kept_ids=None, outside_neg_inf=False, top_k=None,
      top_p=None, empty_kept_full=False):
    logp = logits.new_empty(logits.shape[:-1], dtype=torch.float32)
    ent = logp.new_empty(logits.shape[:-1] if entropy else (0,))
    return logp, ent, _saved_like(logits)


@torch.library.custom_op("detlogp::vocab_parallel_logprobs_backward", mutates_args=())
def vocab_parallel_logprobs_backward(logits: Tensor, saved: Tensor, grad_logp: Optional[Tensor],
                                     grad_entropy: Optional[Tensor]) -> Tensor:
    """The gradient of the logits (their shape and dtype; strides: ``grad_strides``)."""
    from ._layout import grad_strides

    (grad,) = _saved_call(saved).backward((logits,), (grad_logp, grad_entropy), (True,))
    want = grad_strides(logits.shape, logits.stride())
    if grad.stride() != want:  # rows read in token order after all (a layout disagreement)
        grad = torch.empty_strided(logits.shape, want, dtype=grad.dtype,
                                   device=grad.device).copy_(grad)
    return grad


@vocab_parallel_logprobs_backward.register_fake
def _(logits, saved, grad_logp, grad_entropy):
    from ._layout import grad_strides

    return torch.empty_strided(logits.shape, grad_strides(logits.shape, logits.stride()),
                               dtype=logits.dtype, device=logits.device)


def _logprobs_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output[2])
    ctx.entropy_grad = inputs[7] and inputs[13]  # entropy and entropy_grad


def _logprobs_backward(ctx, grad_logp, grad_entropy, grad_saved):
    logits, saved = ctx.saved_tensors
    if not ctx.entropy_grad:
        grad_entropy = None
    grad = None
    if grad_logp is not None or grad_entropy is not None:
        grad = vocab_parallel_logprobs_backward(logits, saved, grad_logp, grad_entropy)
    return (grad,) + (None,) * 21


vocab_parallel_logprobs.register_autograd(_logprobs_backward, setup_context=_logprobs_setup)


# --- detlogp::fused_linear_logprobs --------------------------------------------------------


@torch.library.custom_op("detlogp::fused_linear_logprobs", mutates_args=())
def fused_linear_logprobs(
        hidden: Tensor, weight: Tensor, targets: Tensor, group: str, real_vocab: Optional[int],
        contract: str, entropy: bool, temperature: float, tile_width: Optional[int],
        ignore_index: Optional[int], validate: bool, threads: Optional[int], kernel: str,
        vocab_bounds: Optional[list[int]], softcap: Optional[float],
        row_temperature: Optional[Tensor] = None, loss_mask: Optional[Tensor] = None,
        vocab_start: Optional[int] = None,
        leading_dims: bool = False, kept_ids: Optional[Tensor] = None,
        outside_neg_inf: bool = False, top_k: Optional[Tensor] = None,
        top_p: Optional[Tensor] = None,
        empty_kept_full: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(logp, lse, entropy or an empty tensor, saved state) of ``fused_linear_logprobs``
    (hidden [tokens, H]) or, with ``leading_dims``, of ``fused_vocab_parallel_logprobs``
    (hidden [..., H]: outputs of its leading shape); ``vocab_bounds``: every rank's weight
    rows, flattened (None: even shards)."""
    from . import _fused

    call = _fused._op_call(hidden, weight, targets, group, real_vocab, contract, entropy,
                           temperature, tile_width, ignore_index, validate, threads, kernel,
                           vocab_bounds, softcap, row_temperature, loss_mask, vocab_start,
                           leading_dims, kept_ids, outside_neg_inf, top_k, top_p,
                           empty_kept_full)
    outputs = call.forward((hidden, weight))
    ent = outputs[2] if entropy else torch.zeros(0, dtype=torch.float32)
    return outputs[0], outputs[1], ent, _save(call)


@fused_linear_logprobs.register_fake
def _(hidden, weight, targets, group, real_vocab, contract, entropy, temperature, tile_width,
      ignore_index, validate, threads, kernel, vocab_bounds, softcap, row_temperature=None,
      loss_mask=None, vocab_start=None, leading_dims=False, kept_ids=None,
      outside_neg_inf=False, top_k=None, top_p=None, empty_kept_full=False):
    logp = hidden.new_empty(hidden.shape[:-1], dtype=torch.float32)
    return (logp, torch.empty_like(logp), logp.new_empty(hidden.shape[:-1] if entropy else (0,)),
            _saved_like(hidden))


@torch.library.custom_op("detlogp::fused_linear_logprobs_backward", mutates_args=())
def fused_linear_logprobs_backward(
        hidden: Tensor, weight: Tensor, saved: Tensor, grad_logp: Optional[Tensor],
        grad_lse: Optional[Tensor], grad_entropy: Optional[Tensor], want_hidden: bool,
        want_weight: bool) -> tuple[Tensor, Tensor]:
    """(grad_hidden, grad_weight); an empty tensor for one not wanted. grad_weight is
    contiguous, grad_hidden has the strides ``grad_strides`` gives hidden's shape and strides
    (contiguous for a [tokens, H] hidden)."""
    from ._layout import grad_strides

    gh, gw = _saved_call(saved).backward((hidden, weight), (grad_logp, grad_lse, grad_entropy),
                                         (want_hidden, want_weight))
    want = grad_strides(hidden.shape, hidden.stride())
    if want_hidden and gh.stride() != want:  # rows read in token order (a copy of hidden)
        gh = torch.empty_strided(hidden.shape, want, dtype=gh.dtype).copy_(gh)
    return (gh if want_hidden else hidden.new_empty((0,)),
            gw if want_weight else weight.new_empty((0,)))


@fused_linear_logprobs_backward.register_fake
def _(hidden, weight, saved, grad_logp, grad_lse, grad_entropy, want_hidden, want_weight):
    from ._layout import grad_strides

    gh = hidden.new_empty((0,)) if not want_hidden else torch.empty_strided(
        hidden.shape, grad_strides(hidden.shape, hidden.stride()), dtype=hidden.dtype,
        device=hidden.device)
    gw = weight.new_empty((0,)) if not want_weight else torch.empty_like(
        weight, memory_format=torch.contiguous_format)
    return gh, gw


def _fused_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1], output[3])


def _fused_backward(ctx, grad_logp, grad_lse, grad_entropy, grad_saved):
    hidden, weight, saved = ctx.saved_tensors
    want_hidden, want_weight = ctx.needs_input_grad[:2]
    gh = gw = None
    if (want_hidden or want_weight) and not (
            grad_logp is None and grad_lse is None and grad_entropy is None):
        gh, gw = fused_linear_logprobs_backward(hidden, weight, saved, grad_logp, grad_lse,
                                                grad_entropy, want_hidden, want_weight)
    return (gh if want_hidden else None, gw if want_weight else None) + (None,) * 22


fused_linear_logprobs.register_autograd(_fused_backward, setup_context=_fused_setup)
