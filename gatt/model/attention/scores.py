"""Score functions: (B, H, Tq, D) x (B, H, Tk, D) -> (B, H, Tq, Tk), one score per (query, key).

`SCORE_FUNCTIONS` names them; `make_score` builds one by name. Scaled dot-product is the default of the
core (gatt/model/attention/core.py); `general` and `additive` hold per-head parameters.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

SCORE_FUNCTIONS = ("scaled_dot", "dot", "general", "additive")


class AttentionScore(nn.Module):
    """Base class of the score functions: maps queries and keys to one score per (query, key)."""

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        """Score every query against every key; subclasses implement it.

        Args:
            query: Queries, (B, H, Tq, D).
            key: Keys, (B, H, Tk, D).

        Returns:
            The scores, (B, H, Tq, Tk).

        Raises:
            NotImplementedError: Always, on the base class.
        """
        raise NotImplementedError


class ScaledDotScore(AttentionScore):
    """Scaled dot product q.k / sqrt(D) (Vaswani et al.).

    Args:
        scale: Factor applied to q.k; overrides 1/sqrt(D) (default None: 1/sqrt(D), D the head size).
    """

    def __init__(self, scale: float | None = None) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        """Score every query against every key as q.k times the scale.

        Args:
            query: Queries, (B, H, Tq, D).
            key: Keys, (B, H, Tk, D).

        Returns:
            The scores, (B, H, Tq, Tk).
        """
        scale = self.scale if self.scale is not None else query.shape[-1] ** -0.5
        return (query @ key.transpose(-2, -1)) * scale


class DotScore(AttentionScore):
    """Plain dot product q.k (Luong "dot")."""

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        """Score every query against every key as the unscaled q.k.

        Args:
            query: Queries, (B, H, Tq, D).
            key: Keys, (B, H, Tk, D).

        Returns:
            The scores, (B, H, Tq, Tk).
        """
        return query @ key.transpose(-2, -1)


class GeneralScore(AttentionScore):
    """Bilinear q^T W k (Luong "general"), one W per head.

    The score is scaled by 1/sqrt(D); W starts at the identity plus noise (`reset_parameters`).

    Args:
        num_heads: Number of heads H: one (D, D) matrix W each.
        head_dim: Size D of a head's queries and keys.
    """

    def __init__(self, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_heads, head_dim, head_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Start from the identity plus noise, so the score starts close to a dot product."""
        with torch.no_grad():
            eye = torch.eye(self.weight.shape[-1], dtype=self.weight.dtype, device=self.weight.device)
            self.weight.copy_(eye.expand_as(self.weight) + 0.02 * torch.randn_like(self.weight))

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        """Score every query against every key as q^T W k / sqrt(D), with each head's own W.

        Args:
            query: Queries, (B, H, Tq, D).
            key: Keys, (B, H, Tk, D).

        Returns:
            The scores, (B, H, Tq, Tk).
        """
        query_w = torch.einsum("bhqd,hde->bhqe", query, self.weight)  # (B, H, Tq, D)
        return query_w @ key.transpose(-2, -1) * query.shape[-1] ** -0.5  # (B, H, Tq, Tk)


class AdditiveScore(AttentionScore):
    """Additive v^T tanh(W1 q + W2 k) (Bahdanau), one (W1, W2, v) per head.

    Materialises a (B, H, Tq, Tk, A) tensor: meant for study and short sequences.

    Args:
        num_heads: Number of heads H: one (W1, W2, v) each.
        head_dim: Size D of a head's queries and keys.
        attn_dim: Size A of the hidden layer inside tanh (default None: `head_dim`).
    """

    def __init__(self, num_heads: int, head_dim: int, attn_dim: int | None = None) -> None:
        super().__init__()
        attn_dim = attn_dim or head_dim
        self.w_query = nn.Parameter(torch.empty(num_heads, head_dim, attn_dim))
        self.w_key = nn.Parameter(torch.empty(num_heads, head_dim, attn_dim))
        self.v = nn.Parameter(torch.empty(num_heads, attn_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot-style scale so tanh starts in its linear range."""
        head_dim, attn_dim = self.w_query.shape[-2:]
        nn.init.normal_(self.w_query, std=head_dim**-0.5)
        nn.init.normal_(self.w_key, std=head_dim**-0.5)
        nn.init.normal_(self.v, std=attn_dim**-0.5)

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        """Score every query against every key as v^T tanh(W1 q + W2 k), with each head's own parameters.

        Args:
            query: Queries, (B, H, Tq, D).
            key: Keys, (B, H, Tk, D).

        Returns:
            The scores, (B, H, Tq, Tk).
        """
        q = torch.einsum("bhqd,hda->bhqa", query, self.w_query)  # (B, H, Tq, A)
        k = torch.einsum("bhkd,hda->bhka", key, self.w_key)  # (B, H, Tk, A)
        hidden = torch.tanh(q.unsqueeze(3) + k.unsqueeze(2))  # (B, H, Tq, Tk, A)
        return torch.einsum("bhqka,ha->bhqk", hidden, self.v)  # (B, H, Tq, Tk)


def make_score(name: str, num_heads: int, head_dim: int) -> AttentionScore:
    """Build a score function by name.

    Args:
        name: One of `SCORE_FUNCTIONS`: "scaled_dot", "dot", "general" or "additive".
        num_heads: Number of heads, for the per-head parameters of "general" and "additive".
        head_dim: Size of a head's queries and keys, for "general" and "additive".

    Returns:
        A new score module; "scaled_dot" uses the default scale 1/sqrt(D).

    Raises:
        ValueError: When `name` is unknown; the message names the valid ones.
    """
    if name == "scaled_dot":
        return ScaledDotScore()
    if name == "dot":
        return DotScore()
    if name == "general":
        return GeneralScore(num_heads, head_dim)
    if name == "additive":
        return AdditiveScore(num_heads, head_dim)
    raise ValueError(f"unknown score function {name!r}; expected one of {', '.join(SCORE_FUNCTIONS)}")
