"""Hugging Face integration: `attn_implementation="gatt"` runs any HF model on the functional core.

`register_with_transformers` (called when `gatt` is imported) registers `hf_attention_forward` in
transformers' attention interface and SDPA's mask function in its mask interface, under "gatt".
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from gatt.model.attention.core import masked_attention


def hf_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """The `AttentionInterface` signature, run on the core's `masked_attention`.

    A `split_softmax=SplitSoftmax(...)` keyword given to the model's forward reaches every layer here
    through transformers' attention kwargs (`generate()` refuses keywords its model does not name; the
    library's model names it, so its `generate()` takes it too).

    Args:
        module: The attention layer calling; its `is_causal` is the default of `is_causal`.
        query: The queries (B, H, Tq, D).
        key: The keys (B, H_kv, Tk, D).
        value: The values (B, H_kv, Tk, Dv).
        attention_mask: The bool mask of the "gatt" mask function (transformers' SDPA one), True where a query may
            attend, or None for a plain causal (or single-query) mask.
        scaling: The scale of the dot-product scores (default None: 1/sqrt(D)).
        dropout: The dropout probability of the attention weights (default 0.0).
        is_causal: Whether attention is causal (default None: the module's `is_causal`, else True); applied only
            without a mask and with more than one query.
        **kwargs: Transformers' attention kwargs; `output_attentions` asks for the weights, `split_softmax` is
            passed to the core.

    Returns:
        (output (B, Tq, H, Dv), weights or None).
    """
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # The "gatt" mask function is transformers' SDPA one: None means a plain causal (or single-query) mask.
    output, weights = masked_attention(
        query,
        key,
        value,
        attention_mask,
        is_causal=is_causal and attention_mask is None and query.shape[2] > 1,
        scale=scaling,
        dropout_p=dropout,
        return_weights=bool(kwargs.get("output_attentions", False)),
        split_softmax=kwargs.get("split_softmax"),
    )
    return output.transpose(1, 2).contiguous(), weights


def register_with_transformers(name: str = "gatt") -> None:
    """Register the core in transformers' attention and mask interfaces under `name`.

    Args:
        name: The `attn_implementation` name to register (default "gatt").
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, hf_attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
