"""Representation distillation for GAtt: the student matches the teacher's hidden states, not only its replies.

GAtt's data are the replies of the reminded model (the instruction appended to every user message); the student is
trained on them with the instruction only in turn one. With `TrainConfig.distill_weight` > 0 the student also
matches, at every position that predicts a supervised reply token, the hidden state after each decoder layer of the
frozen start model reading the reminded dialogue (`GAttCollator(teacher_view=True)` pairs the positions). Replies
tell the student which behaviour to show; the hidden states also carry how the reminded model read the instruction
at that point, which the student can only rebuild by reading its system message from afar.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's decoder layers in order (any Hugging Face causal LM, wrapped by peft or Accelerate or not).

    Args:
        model: the model.

    Returns:
        Its modules whose class name ends with `DecoderLayer`, in module order.

    Raises:
        ValueError: when the model has no such module.
    """
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no module named *DecoderLayer: hidden states cannot be matched")
    return layers


@contextmanager
def layer_outputs(model: nn.Module) -> Iterator[list[Tensor]]:
    """Collects each decoder layer's output hidden states (B, T, C) of the forward passes run inside the block.

    Args:
        model: the model whose decoder layers are hooked (the hooks are removed on leaving the block).

    Yields:
        The list the outputs are appended to, layer by layer, pass after pass.

    Raises:
        ValueError: when the model has no decoder layers (`decoder_layers`).
    """
    outputs: list[Tensor] = []

    def keep(_: nn.Module, __: object, output: Tensor | tuple[Tensor, ...]) -> None:
        outputs.append(output[0] if isinstance(output, tuple) else output)

    handles = [layer.register_forward_hook(keep) for layer in decoder_layers(model)]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def hidden_distance(student: list[Tensor], teacher: list[Tensor], index: Tensor) -> Tensor:
    """Sum over layers of mean ||h_student - h_teacher||^2 / mean ||h_teacher||^2 at the paired positions.

    Args:
        student: one (B, T, C) tensor per layer (the first forward pass's, in layer order).
        teacher: one (B, T, C) tensor per layer (the first forward pass's, in layer order).
        index: (N, 2) flat indices into the student's and the teacher's (B x T) positions.

    Returns:
        The distance, a scalar tensor.
    """
    layers = len(teacher)
    terms = []
    for mine, theirs in zip(student[:layers], teacher, strict=True):
        s = mine.flatten(0, 1)[index[:, 0]]  # (N, C)
        t = theirs.flatten(0, 1)[index[:, 1]].to(s.dtype)  # (N, C)
        terms.append((s - t).pow(2).sum(-1).mean() / t.pow(2).sum(-1).mean().clamp_min(1e-12))
    return torch.stack(terms).sum()
