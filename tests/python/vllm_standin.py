"""A stand-in for the vLLM classes that ``detlogp.vllm.DetlogpSampler`` meets in a vLLM worker,
for tests/python/test_vllm_adapter.py: the V1 sampler's metadata and outputs, written from
vLLM's source (``vllm/v1/sample/metadata.py``, ``vllm/v1/outputs.py``,
``vllm/v1/sample/logits_processor/builtin.py`` and the contract of
``vllm/v1/sample/sampler.py``'s ``Sampler.forward(logits, sampling_metadata,
predict_bonus_token=False, logprobs_mode_override=None) -> SamplerOutput``), as on vLLM's main
branch before the V1 sampler moved into model runner V2. The real package is not used: vLLM
0.34.0 (PyPI) is a 239 MB wheel whose ``vllm.v1.outputs`` pulls in vLLM's config (pydantic,
transformers, zmq, aiohttp, ...), and it no longer has ``vllm.v1.sample.sampler`` nor
``vllm.v1.sample.metadata`` (its samplers live in ``vllm/v1/worker/{gpu,cpu}``).

Only the fields and types are mirrored; the behaviour under test is detlogp's.
"""

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import torch


class LogprobsTensors(NamedTuple):
    logprob_token_ids: torch.Tensor  # int32 [rows, max_num_logprobs + 1]
    logprobs: torch.Tensor  # fp32 [rows, max_num_logprobs + 1]
    selected_token_ranks: torch.Tensor  # [rows]
    cu_num_generated_tokens: Optional[list] = None


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # int32 [rows, 1]
    logprobs_tensors: Optional[LogprobsTensors]


# vLLM's built-in logits processors: present in every batch, active when their state is set.
class MinPLogitsProcessor:
    def __init__(self, min_p_count=0):
        self.min_p_count = min_p_count


class LogitBiasLogitsProcessor:
    def __init__(self, biases=None):
        self.biases = biases or {}


class MinTokensLogitsProcessor:
    def __init__(self, min_toks=None):
        self.min_toks = min_toks or {}


class SomeCustomLogitsProcessor:
    """A user's processor: nothing says what it does to the logits."""


@dataclass
class LogitsProcessors:
    argmax_invariant: list = field(default_factory=lambda: [MinPLogitsProcessor()])
    non_argmax_invariant: list = field(
        default_factory=lambda: [LogitBiasLogitsProcessor(), MinTokensLogitsProcessor()])


@dataclass
class SamplingMetadata:
    temperature: Optional[torch.Tensor]  # fp32 [rows]; None when all_greedy
    all_greedy: bool
    all_random: bool
    top_p: Optional[torch.Tensor]  # fp32 [rows]; 1.0 = off; None when no row uses it
    top_k: Optional[torch.Tensor]  # int32 [rows]; vocab size = off; None when no row uses it
    generators: dict  # row -> torch.Generator, for requests with a seed
    max_num_logprobs: Optional[int]  # None: no logprobs; 0: the sampled token's only
    no_penalties: bool = True
    prompt_token_ids: Optional[torch.Tensor] = None
    frequency_penalties: Optional[torch.Tensor] = None
    presence_penalties: Optional[torch.Tensor] = None
    repetition_penalties: Optional[torch.Tensor] = None
    output_token_ids: list = field(default_factory=list)  # per row, the tokens so far
    allowed_token_ids_mask: Optional[torch.Tensor] = None
    bad_words_token_ids: dict = field(default_factory=dict)
    logitsprocs: LogitsProcessors = field(default_factory=LogitsProcessors)
    logprobs_mode_override: Optional[object] = None
    spec_token_ids: Optional[list] = None


def generator(seed):
    """A request's generator as vLLM makes it from SamplingParams.seed."""
    return torch.Generator().manual_seed(seed)
