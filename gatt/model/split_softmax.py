"""Split-softmax: the instruction's share of every head's attention boosted at inference, no fine-tuning.

Li, Liu, Bashkansky, Bau, Viégas, Pfister and Wattenberg, "Measuring and Controlling Instruction
(In)Stability in Language Model Dialogs", COLM 2024 (arXiv:2402.10962), Section 6. For one head and one
query, let alpha be the softmax weights over the keys and S the instruction's tokens (the paper's system
prompt), and

    pi = sum_{j in S} alpha_j                                the attention mass on the instruction.

Split-softmax rescales the two parts of the softmax so that the instruction's mass becomes pi^k, a power
law with 0 <= k <= 1 (pi^k >= pi), and renormalises the rest:

    alpha'_j = alpha_j * pi^k / pi                for j in S
    alpha'_j = alpha_j * (1 - pi^k) / (1 - pi)    otherwise.

The weights still sum to one and keep their proportions inside each part. Here the knob is the
`strength` s = 1 - k: s = 0 changes nothing, s = 1 puts all attention on the instruction. It applies to
every layer and head, and to the queries after the instruction's last token.

The fast path never materialises the (Tq, Tk) weights. With O = sum_j alpha_j v_j (all keys), O_S the
attention over the instruction's keys alone (its own softmax), and b = (1 - pi^k) / (1 - pi) in [0, 1]:

    O' = pi^k O_S + b (O - pi O_S) = b O + (pi^k - b pi) O_S,

stable as pi -> 1 (b -> k). One fused attention call gives O and pi at once (the values carry one extra
channel, 1 on the instruction's keys, whose output is pi); a second one over the instruction's gathered
keys gives O_S.

Masks are boolean, True where a query may attend to a key. Shapes: B batch, H heads, Hkv key/value
heads, Tq queries (the last Tq of the Tk key columns, as with a KV cache), L instruction tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class SplitSoftmax:
    """What every attention layer needs: the strength and each row's instruction key columns.

    `columns` (B, L) long: the key (cache) columns of each row's instruction tokens, padded with -1; a row
    with none is left unchanged. Build it with `SplitSoftmax.from_columns`.
    """

    strength: float
    columns: Tensor
    last: Tensor = field(init=False)  # (B,): each row's last instruction column, -1 for none
    max_column: int = field(init=False)  # read once here, not with a device sync in every layer

    def __post_init__(self) -> None:
        if not 0.0 <= self.strength <= 1.0:
            raise ValueError(f"split-softmax strength must lie in [0, 1] (0: no change), got {self.strength}")
        if self.columns.ndim != 2 or self.columns.dtype != torch.long:
            raise ValueError(
                f"columns must be a (batch, L) long tensor, got {tuple(self.columns.shape)} {self.columns.dtype}"
            )
        last = self.columns.max(dim=1).values
        object.__setattr__(self, "last", last)
        object.__setattr__(self, "max_column", int(last.max()) if last.numel() else -1)

    @classmethod
    def from_columns(cls, strength: float, columns: Sequence[Sequence[int]], device: Any = None) -> SplitSoftmax:
        """Build it from one list of instruction key columns per batch row.

        Args:
            strength: s = 1 - k, in [0, 1] (0: no change, 1: all attention on the instruction).
            columns: Per batch row, the key (cache) columns of its instruction tokens (an empty list: no
                instruction in that row).
            device: The device of the column tensor (default None: the CPU).

        Returns:
            The split-softmax, its columns padded with -1 into a (B, L) long tensor.

        Raises:
            ValueError: When a column is negative, or `strength` lies outside [0, 1].
        """
        width = max((len(c) for c in columns), default=0)
        padded = torch.full((len(columns), max(width, 1)), -1, dtype=torch.long)
        for i, cols in enumerate(columns):
            if any(c < 0 for c in cols):
                raise ValueError(f"row {i}: instruction columns must be >= 0, got {list(cols)}")
            padded[i, : len(cols)] = torch.tensor(list(cols), dtype=torch.long)
        return cls(strength, padded.to(device))

    @property
    def exponent(self) -> float:
        """The paper's k = 1 - strength."""
        return 1.0 - self.strength

    def instruction_mask(self, key_length: int) -> Tensor:
        """The instruction's key columns as a mask.

        Args:
            key_length: The number of key columns, Tk.

        Returns:
            (B, Tk) bool: True on the instruction's key columns.

        Raises:
            ValueError: When an instruction column lies beyond the `key_length` keys.
        """
        if self.max_column >= key_length:
            raise ValueError(f"an instruction column ({self.max_column}) lies beyond the {key_length} keys")
        mask = torch.zeros(self.columns.shape[0], key_length + 1, dtype=torch.bool, device=self.columns.device)
        mask.scatter_(1, torch.where(self.columns < 0, key_length, self.columns), True)  # -1 padding -> a spare column
        return mask[:, :key_length]

    def boosted_queries(self, query_length: int, key_length: int) -> Tensor:
        """The queries split-softmax changes, those after the row's last instruction token.

        The queries are the last Tq of the Tk key columns, as with a KV cache; a row without instruction has none.

        Args:
            query_length: The number of queries, Tq.
            key_length: The number of key columns, Tk.

        Returns:
            (B, 1, Tq, 1) bool: True on the queries changed.
        """
        last = self.last  # (B,), -1: no instruction
        query_columns = torch.arange(key_length - query_length, key_length, device=self.columns.device)  # (Tq,)
        boosted = (query_columns[None, :] > last[:, None]) & (last[:, None] >= 0)  # (B, Tq)
        return boosted[:, None, :, None]

    def _check_batch(self, batch: int) -> None:
        if self.columns.shape[0] != batch:
            raise ValueError(
                f"split-softmax has instruction columns for {self.columns.shape[0]} rows, the batch has {batch}"
            )


def split_softmax_weights(weights: Tensor, split: SplitSoftmax) -> Tensor:
    """The paper's formula on explicit softmax weights (B, H, Tq, Tk) -> (B, H, Tq, Tk).

    Only the queries after a row's last instruction token change; a query with no weight on the instruction is
    left as it is.

    Args:
        weights: Softmax weights, (B, H, Tq, Tk).
        split: The strength and each row's instruction key columns.

    Returns:
        The rescaled weights, (B, H, Tq, Tk), in the dtype of `weights`.

    Raises:
        ValueError: When `split` has columns for another number of rows than the batch, or a column beyond Tk.
    """
    batch, _, query_length, key_length = weights.shape
    split._check_batch(batch)
    on_instruction = split.instruction_mask(key_length)[:, None, None, :]  # (B, 1, 1, Tk)
    exact = weights.to(torch.promote_types(weights.dtype, torch.float32))
    pi = (exact * on_instruction).sum(-1, keepdim=True)  # (B, H, Tq, 1)
    boosted_pi = torch.where(pi > 0, pi.pow(split.exponent), 0.0)  # pi = 0: nothing to boost, no change
    scale_instruction = torch.where(pi > 0, boosted_pi / pi, 1.0)
    scale_rest = torch.where(pi < 1, (1 - boosted_pi) / (1 - pi), 1.0)
    scale = torch.where(on_instruction, scale_instruction, scale_rest)  # (B, H, Tq, Tk)
    boosted = split.boosted_queries(query_length, key_length)  # (B, 1, Tq, 1)
    return torch.where(boosted, exact * scale, exact).to(weights.dtype)


def split_softmax_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, split: SplitSoftmax, *, scale: float | None = None
) -> Tensor:
    """Attention with split-softmax, from two fused attention calls.

    Args:
        query: Queries, (B, H, Tq, D).
        key: Keys, (B, Hkv, Tk, D).
        value: Values, (B, Hkv, Tk, Dv).
        mask: Bool, True where a query may attend, broadcastable to (B, H, Tq, Tk), with the causal part already in
            it (None: every query sees every key).
        split: The strength and each row's instruction key columns.
        scale: Scale of the dot-product scores (default None: 1/sqrt(D)).

    Returns:
        The attention output, (B, H, Tq, Dv).

    Raises:
        ValueError: When `split` has columns for another number of rows than the batch, or a column beyond Tk.
    """
    batch, heads, query_length, _ = query.shape
    kv_heads, key_length, value_dim = key.shape[1], key.shape[2], value.shape[-1]
    split._check_batch(batch)
    grouped = heads != kv_heads
    on_instruction = split.instruction_mask(key_length)  # (B, Tk)
    # O and pi in one call: the extra value channel is 1 on the instruction's keys.
    indicator = on_instruction[:, None, :, None].to(value.dtype).expand(batch, kv_heads, key_length, 1)
    both = F.scaled_dot_product_attention(
        query, key, torch.cat([value, indicator], dim=-1), attn_mask=mask, scale=scale, enable_gqa=grouped
    )  # (B, H, Tq, Dv + 1)
    exact = torch.promote_types(value.dtype, torch.float32)  # the recombination in at least fp32
    output, pi = both[..., :value_dim], both[..., value_dim:].to(exact).clamp(0.0, 1.0)  # (B, H, Tq, Dv), (B, H, Tq, 1)
    # O_S: the instruction's keys gathered per row, under the same mask.
    columns = split.columns.clamp(min=0)  # (B, L)
    valid = split.columns >= 0  # (B, L)
    index = columns[:, None, :, None]  # (B, 1, L, 1)
    key_s = key.gather(2, index.expand(batch, kv_heads, -1, key.shape[-1]))  # (B, Hkv, L, D)
    value_s = value.gather(2, index.expand(batch, kv_heads, -1, value_dim))  # (B, Hkv, L, Dv)
    visible = valid[:, None, None, :]  # (B, 1, 1, L)
    if mask is not None:
        full = mask.expand(batch, mask.shape[1], query_length, key_length)
        visible = visible & full.gather(3, columns[:, None, None, :].expand(batch, full.shape[1], query_length, -1))
    sees_instruction = visible.any(-1, keepdim=True)  # (B, H|1, Tq, 1)
    # A row that sees none of its instruction's keys gets a harmless key so the kernel never softmaxes an empty row.
    visible = visible | (~sees_instruction & (torch.arange(visible.shape[-1], device=visible.device) == 0))
    output_s = F.scaled_dot_product_attention(query, key_s, value_s, attn_mask=visible, scale=scale, enable_gqa=grouped)
    boosted_pi = pi.pow(split.exponent)
    rest_scale = torch.where(pi < 1, (1 - boosted_pi) / (1 - pi), torch.full_like(pi, split.exponent))  # b in [0, 1]
    combined = rest_scale * output.to(exact) + (boosted_pi - rest_scale * pi) * output_s.to(exact)  # (B, H, Tq, Dv)
    apply = split.boosted_queries(query_length, key_length) & sees_instruction & (pi > 0)  # (B, H|1, Tq, 1)
    return torch.where(apply, combined.to(output.dtype), output)


__all__ = ["SplitSoftmax", "split_softmax_attention", "split_softmax_weights"]
