"""detlogp: deterministic vocab-parallel log-probabilities (Python package).

    import detlogp
    contract = detlogp.LogprobContract(role="train", dtype="bf16", mask=..., sharding=...)
    op, provenance = detlogp.get_logprob_op(contract)
    logp, lse = op(local_logits, target_ids, contract=contract, group=tp_group)

or, with the contract built and cached internally, on N-D logits and a loss mask:

    from detlogp.torch import vocab_parallel_logprobs
    logp = vocab_parallel_logprobs(logits[:, :-1], input_ids[:, 1:], group=tp_group)

See docs/python.md. The contract types keep the class and field names listed in
docs/contract.md, "Compatibility"; every validation failure raises
``LogprobContractError`` (a ValueError).
"""

from ._native import _detlogp  # a clear ImportError for an extension built for another Python
from ._comm import Communicator, SelfComm, TorchDistributedComm
from ._contract import (LogprobBackendCapability, LogprobContract, LogprobOutputSpec, MaskSpec,
                        OutputSpec, ReductionSpec, ShardingSpec, even_bounds,
                        even_tile_aligned_bounds, megatron_bounds, megatron_padded_vocab)
from ._detlogp import LogprobContractError
from ._enums import (IMPLEMENTATION_KINDS, RESERVED_DISPATCH_POLICIES, DeterminismScope,
                     DowncastPoint, DType, Engine, ImplementationKind, MaskMode, Merge,
                     MergeAxis, ReductionOrder, Role, TPPlacement, Transport)
from ._op import LogprobDispatchResult, LogprobForward, LogprobOp, cuda_status, get_logprob_op
from ._registry import Backend, Registry, get_op, register_logprob_backend
from ._drift import drift, drift_thresholds
from ._fused import fused_kernel_names, fused_linear_logprobs, linear_logits
from ._sample import SampleOutput, sample

__version__ = _detlogp.version()
NUMERICS_VERSION = _detlogp.NUMERICS_VERSION
DEFAULT_TILE_WIDTH = _detlogp.DEFAULT_TILE_WIDTH
CPU_CANONICAL_BACKEND_ID = _detlogp.CPU_CANONICAL_BACKEND_ID
CPU_REFERENCE_BACKEND_ID = _detlogp.CPU_REFERENCE_BACKEND_ID
CPU_BATCH_INVARIANT_BACKEND_ID = _detlogp.CPU_BATCH_INVARIANT_BACKEND_ID
CUDA_BUILT = _detlogp.CUDA_BUILT  # the CUDA backend is compiled in (docs/cuda.md)
CUDA_CANONICAL_BACKEND_ID = _detlogp.CUDA_CANONICAL_BACKEND_ID  # None without CUDA

__all__ = [
    "LogprobContractError", "LogprobContract", "ShardingSpec", "MaskSpec", "ReductionSpec",
    "LogprobOutputSpec", "OutputSpec", "LogprobBackendCapability", "Role", "DType", "Merge",
    "MergeAxis", "ReductionOrder", "Transport", "DowncastPoint", "Engine", "TPPlacement",
    "DeterminismScope", "MaskMode", "ImplementationKind", "RESERVED_DISPATCH_POLICIES",
    "IMPLEMENTATION_KINDS", "get_logprob_op", "LogprobDispatchResult", "LogprobOp",
    "LogprobForward", "Communicator", "SelfComm", "TorchDistributedComm", "even_bounds",
    "even_tile_aligned_bounds", "megatron_bounds", "megatron_padded_vocab", "NUMERICS_VERSION",
    "DEFAULT_TILE_WIDTH", "CPU_CANONICAL_BACKEND_ID", "CPU_REFERENCE_BACKEND_ID",
    "CPU_BATCH_INVARIANT_BACKEND_ID", "CUDA_BUILT", "CUDA_CANONICAL_BACKEND_ID", "cuda_status",
    "Registry", "Backend", "register_logprob_backend", "get_op", "drift", "drift_thresholds",
    "__version__", "fused_linear_logprobs", "linear_logits", "fused_kernel_names", "sample",
    "SampleOutput",
]
