"""Masked multi-head attention: score functions, masks, the functional core and the module.

One concept a file, the data flowing one way (a file imports only those listed above it):

- `scores.py`: the score functions (`AttentionScore` and its subclasses, `SCORE_FUNCTIONS`, `make_score`);
- `masks.py`: boolean masks (True = may attend) and the packed rows' segment ids and spans;
- `rotary.py`: rotary position embeddings (`RotaryEmbedding`, `apply_rotary`);
- `core.py`: `masked_attention` with its fast (SDPA) and explicit paths, `segmented_attention`, `repeat_kv`;
- `linformer.py`: `linformer_attention`, keys and values projected along the sequence;
- `inputs.py`: what the module's forward accepts (the `KVCache` protocol, the argument checks);
- `module.py`: `MaskedMultiHeadAttention` (grouped-query heads, RoPE, KV cache, cross-attention, Linformer);
- `registration.py`: `attn_implementation="gatt"` for Hugging Face models (`register_with_transformers`).

Shapes: B batch, H query heads, Hkv key/value heads, Tq queries, Tk keys, D head dim.
Every name below is importable from `gatt.model.attention`, as it was from the single module before.
"""

from gatt.model.attention.core import masked_attention, repeat_kv, segmented_attention
from gatt.model.attention.inputs import KVCache
from gatt.model.attention.linformer import linformer_attention
from gatt.model.attention.masks import build_attention_mask, causal_mask, segment_ids_from_position_ids, segment_spans
from gatt.model.attention.module import MaskedMultiHeadAttention
from gatt.model.attention.registration import hf_attention_forward, register_with_transformers
from gatt.model.attention.rotary import RotaryEmbedding, apply_rotary, default_inv_freq
from gatt.model.attention.scores import (
    SCORE_FUNCTIONS,
    AdditiveScore,
    AttentionScore,
    DotScore,
    GeneralScore,
    ScaledDotScore,
    make_score,
)

__all__ = [
    "SCORE_FUNCTIONS",
    "AdditiveScore",
    "AttentionScore",
    "DotScore",
    "GeneralScore",
    "KVCache",
    "MaskedMultiHeadAttention",
    "RotaryEmbedding",
    "ScaledDotScore",
    "apply_rotary",
    "build_attention_mask",
    "causal_mask",
    "default_inv_freq",
    "hf_attention_forward",
    "linformer_attention",
    "make_score",
    "masked_attention",
    "register_with_transformers",
    "repeat_kv",
    "segment_ids_from_position_ids",
    "segment_spans",
    "segmented_attention",
]
