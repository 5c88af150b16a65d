"""The numeric mode a model generates in: the exact fp32 path, bf16, or int8 on CPU.

- `exact`: the model as it is (fp32 weights and activations).
- `bf16`: weights and activations in bfloat16 (norms accumulate in fp32); on a CPU, in the library's attention
  (`MaskedMultiHeadAttention.attention_dtype`) the scores, softmax, KV cache and weighted sum stay fp32 (below);
  on a GPU the KV cache and attention are bf16 too (its fused SDPA kernels take bf16, and a cache half the size
  is half the memory traffic of a decoding step).
  On a CPU with bf16 instructions (AVX512-BF16 or AMX; `bf16_is_native()`) a GEMM has run 3-4x faster
  than in fp32 (an AMD EPYC), and 2x *slower* on a virtual Xeon whose flags claim AVX512-BF16; on one without them
  bf16 is emulated and several times slower. So `auto` measures, and never trusts the flags alone. Attention over a
  long cache is bound by memory, not arithmetic, and PyTorch's CPU kernels read a bf16 cache more
  slowly than an fp32 one (SDPA 5x slower, a batched matmul on the cache's strided view 1.5x): so the
  cache stays fp32, which also keeps the attention as exact as the projections allow. Greedy replies
  differ from the exact path's after the first near-tie.
- `int8`: PyTorch's dynamic quantisation of every `nn.Linear` (the projections, the MLP and the LM
  head): weights stored in int8 per output channel, activations quantised per call, products in int8
  on fbgemm's x86 kernels; about 1.8x faster at batch 64 on 2 cores.

- `auto`: `bf16` where the device does bf16 arithmetic fast (`bf16_is_fast`), `exact` elsewhere; the choice
  is printed. The same test picks a training run's `mixed_precision: auto` (gatt/training/trainer.py).

Both fast modes are inference only and change the replies: use one for rollouts and the teacher only
where the trade is measured (`benchmarks/run.py`: `smollm2_rollout_tokens_per_s` gives each mode's
speed beside its agreement with the exact path). On SmolLM2-135M-Instruct int8 does not pay: a report
stage ran 1.96x faster, but no reply matched the exact path's and on-topic answers halved
(docs/evaluation.md).
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Literal

import torch
from torch import nn
from transformers import PreTrainedModel

from gatt.model.attention import MaskedMultiHeadAttention

Numerics = Literal["exact", "bf16", "int8", "auto"]
NUMERICS: tuple[str, ...] = ("exact", "bf16", "int8", "auto")


def bf16_is_native() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (oneDNN's AVX512-BF16 or AMX kernels).

    Returns:
        True where oneDNN (mkldnn) is available and reports bf16 support.
    """
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def bf16_is_fast(device: torch.device | str = "cpu") -> bool:
    """Whether bf16 arithmetic pays on `device`.

    The CPU's flags are not enough: bf16 has run at half fp32's speed on a machine that reports AVX512-BF16, and on
    AVX2 alone it is emulated, several times slower.

    Args:
        device: The device to test (default "cpu").

    Returns:
        For a GPU, whether it supports bf16; for a CPU, whether a one-second probe finds bf16 matrix products faster
        than fp32 ones (measured once a process); False for any other device type.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and _cpu_bf16_is_faster()


@functools.cache
def _cpu_bf16_is_faster() -> bool:
    from gatt.io.machine import matmul_gflops

    return matmul_gflops(torch.bfloat16, size=512, seconds=0.5) > matmul_gflops(torch.float32, size=512, seconds=0.5)


def resolve_auto(setting: str, device: torch.device | str, fast: str, slow: str, what: str) -> str:
    """Resolve an "auto" setting by whether bf16 pays on `device` (`bf16_is_fast`).

    For "auto", which was chosen and why is printed on stderr.

    Args:
        setting: The configured value; anything but "auto" is returned as it is.
        device: The device the work runs on.
        fast: The value chosen for "auto" where bf16 pays.
        slow: The value chosen for "auto" elsewhere.
        what: The setting's name, for the message on stderr.

    Returns:
        `setting`, or for "auto" `fast` or `slow`.
    """
    if setting != "auto":
        return setting
    chosen = fast if bf16_is_fast(device) else slow
    kind = torch.device(device).type
    why = "has fast bf16 arithmetic" if chosen == fast else "has no fast bf16 arithmetic"
    print(f"{what}: auto -> {chosen} (this {kind} {why})", file=sys.stderr, flush=True)
    return chosen


def for_inference(model: PreTrainedModel, numerics: Numerics | str = "exact") -> PreTrainedModel:
    """Make `model` ready to generate in `numerics`, in place.

    Args:
        model: The model to convert.
        numerics: The numeric mode (default "exact"): exact: unchanged; bf16: cast, the library's attention kept
            fp32 on a CPU; int8: Linear layers quantised; auto: bf16 where it pays, else exact.

    Returns:
        The model, converted (the same object for exact, bf16 and int8).

    Raises:
        ValueError: When `numerics` is not one of `NUMERICS`, or is int8 and the model is not on a CPU.
    """
    numerics = resolve_auto(numerics, model.device, "bf16", "exact", "numerics")
    if numerics == "exact":
        return model
    if numerics == "bf16":
        model = model.to(torch.bfloat16).eval()
        for module in model.modules():
            if isinstance(module, MaskedMultiHeadAttention):
                module.attention_dtype = torch.float32 if model.device.type == "cpu" else None
        return model
    if numerics != "int8":
        raise ValueError(f"numerics {numerics!r} is not one of {', '.join(NUMERICS)}")
    if model.device.type != "cpu":
        raise ValueError(f"numerics int8 runs on CPU only (fbgemm kernels); the model is on {model.device}")
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's notice that eager quantisation is moving to torchao
        return quantize_dynamic(model.eval(), {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)


__all__ = ["NUMERICS", "Numerics", "bf16_is_fast", "bf16_is_native", "for_inference", "resolve_auto"]
