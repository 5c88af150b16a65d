"""Rotary position embeddings (the rotate-half layout of Hugging Face Llama checkpoints).

`RotaryEmbedding` maps position ids to the (cos, sin) tables every layer shares; `apply_rotary` rotates
queries and keys alike (self-attention), `_rotate` one side by its own tables (cross-attention).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RotaryEmbedding(nn.Module):
    """Maps position ids (B, T) to the (cos, sin) tables (B, T, D) shared by every layer.

    Args:
        head_dim: D, the attention heads' dimension.
        base: the RoPE base of the default inverse frequencies.
        inv_freq: the (D/2,) inverse frequencies (default: `default_inv_freq(head_dim, base)`).
        scaling: the factor both tables are multiplied by.
    """

    def __init__(
        self, head_dim: int, base: float = 10000.0, inv_freq: Tensor | None = None, scaling: float = 1.0
    ) -> None:
        super().__init__()
        self.head_dim, self.base, self.scaling = head_dim, base, scaling
        if inv_freq is None:
            inv_freq = default_inv_freq(head_dim, base)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @torch.no_grad()
    def forward(self, position_ids: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """The (cos, sin) tables of the positions.

        Args:
            position_ids: (B, T) positions.
            dtype: the tables' dtype (computed in float32).

        Returns:
            (cos, sin), each (B, T, D), scaled by `scaling`.
        """
        freqs = position_ids[..., None].float() * self.inv_freq.float()  # (B, T, D/2)
        angles = torch.cat((freqs, freqs), dim=-1)  # (B, T, D)
        return (angles.cos() * self.scaling).to(dtype), (angles.sin() * self.scaling).to(dtype)


def default_inv_freq(head_dim: int, base: float) -> Tensor:
    """The inverse frequencies of the original RoPE.

    Args:
        head_dim: the attention heads' dimension D.
        base: the RoPE base.

    Returns:
        The (D/2,) float tensor 1 / base^(2i / D).
    """
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


def apply_rotary(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotate query and key by the angles of their positions.

    Args:
        query: (B, H, T, D) queries.
        key: (B, Hkv, T, D) keys.
        cos: (B, T, D) cosine table of the positions.
        sin: (B, T, D) sine table of the positions.

    Returns:
        The rotated (query, key), shapes unchanged.
    """
    return _rotate(query, cos, sin), _rotate(key, cos, sin)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, H, T, D) by the (cos, sin) tables (B, T, D) of its positions (cross-attention: each side its own)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, D)
    return x * cos + _rotate_half(x) * sin
