"""The numeric mode a model generates in: the exact fp32 path, or int8 on CPU for speed.

`int8` is PyTorch's dynamic quantisation of every `nn.Linear` (the projections, the MLP and the LM
head): weights stored in int8 per output channel, activations quantised per call, products in int8 on
fbgemm's x86 kernels. On 2 CPU cores a decode step of SmolLM2-135M at batch 64 is GEMM-bound, and
this mode runs it about 1.8x faster. It is inference only (no gradients) and changes greedy replies:
use it for rollouts and the teacher only where that trade is measured and acceptable
(`benchmarks/run.py`: `smollm2_rollout_tokens_per_s` gives its agreement with the exact path). On
SmolLM2-135M-Instruct it is not: a report stage ran 1.96x faster, but no reply matched the exact path's
and on-topic answers halved (README, Evaluation: Numerics).
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
from torch import nn
from transformers import PreTrainedModel

Numerics = Literal["exact", "int8"]
NUMERICS: tuple[str, ...] = ("exact", "int8")


def for_inference(model: PreTrainedModel, numerics: Numerics | str = "exact") -> PreTrainedModel:
    """`model` ready to generate in `numerics` ("exact": unchanged; "int8": its Linear layers quantised, in place)."""
    if numerics == "exact":
        return model
    if numerics != "int8":
        raise ValueError(f"numerics {numerics!r} is not one of {', '.join(NUMERICS)}")
    if model.device.type != "cpu":
        raise ValueError(f"numerics int8 runs on CPU only (fbgemm kernels); the model is on {model.device}")
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's notice that eager quantisation is moving to torchao
        return quantize_dynamic(model.eval(), {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)


__all__ = ["NUMERICS", "Numerics", "for_inference"]
