"""`GattForCausalLM`: a Llama-compatible decoder-only LM built on the library's masked multi-head attention.

RMSNorm, SwiGLU MLP, rotary positions and `MaskedMultiHeadAttention`, packaged as a transformers
`PreTrainedModel` with `GenerationMixin`. Parameter names are those of Hugging Face Llama, so a
Llama checkpoint converts with `GattForCausalLM.from_llama` and PEFT targets the usual names.

Packed rows: pass `segment_ids` (B, T) with one id per dialogue, or `position_ids` that restart at
0 for each dialogue (what TRL's padding-free collators produce); tokens never attend across a
dialogue boundary, so a packed row trains exactly like the separate rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    GenerationMixin,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
)
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from gatt.model.attention import (
    SCORE_FUNCTIONS,
    AdditiveScore,
    GeneralScore,
    MaskedMultiHeadAttention,
    RotaryEmbedding,
    build_attention_mask,
    default_inv_freq,
    segment_ids_from_position_ids,
    segment_spans,
)
from gatt.model.cache import cache_kwargs, either_cache, output_cache
from gatt.model.split_softmax import SplitSoftmax


@strict
class GattConfig(LlamaConfig):
    """Llama's configuration plus the attention's own knobs: the score function and a local window."""

    model_type = "gatt"

    score_function: str = "scaled_dot"
    attention_window: int | None = None
    # Not a field: TRL builds GRPO's reference model (beta > 0, no LoRA) with `create_model_from_path`, which reads
    # `config.auto_map` for an architecture transformers does not define; empty, it loads the model with
    # AutoModelForCausalLM, where "gatt" is registered (tests/test_grpo.py).
    auto_map: ClassVar[Mapping[str, str]] = MappingProxyType({})

    def validate_architecture(self) -> None:
        """Refuse configurations the attention cannot build, naming the field."""
        super().validate_architecture()
        if self.score_function not in SCORE_FUNCTIONS:
            raise ValueError(f"score_function {self.score_function!r} is not one of {', '.join(SCORE_FUNCTIONS)}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.attention_window is not None and self.attention_window < 1:
            raise ValueError(f"attention_window must be >= 1 or None, got {self.attention_window}")


def rope_inv_freq(config: GattConfig) -> tuple[Tensor, float]:
    """Inverse frequencies and attention scaling for the config's RoPE type (transformers' tables).

    Args:
        config: The model's configuration; its `rope_parameters` give the RoPE type (default "default") and, for
            the default type, `rope_theta` (default 10000).

    Returns:
        The inverse frequencies, (head_dim / 2,), and the attention scaling (1.0 for the default type).

    Raises:
        ValueError: When the RoPE type is dynamic, longrope or unknown to transformers: a static one is needed
            (default, linear, llama3, yarn).
    """
    rope = config.rope_parameters or {}
    rope_type = rope.get("rope_type", "default")
    if rope_type == "default":
        return default_inv_freq(config.head_dim, rope.get("rope_theta", 10000.0)), 1.0
    if rope_type in ("dynamic", "longrope") or rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope_type {rope_type!r} is not supported; use a static one (default, linear, llama3, yarn)")
    return ROPE_INIT_FUNCTIONS[rope_type](config)


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 as Llama does so bf16 training matches.

    Args:
        hidden_size: The width of the normalised last dimension, the size of the learned weight (ones at first).
        eps: Added to the mean square for numerical stability (default 1e-6).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states: Tensor) -> Tensor:
        """Normalise the last dimension and scale it by the weight.

        Args:
            hidden_states: Activations, (..., hidden_size).

        Returns:
            The normalised activations, of the same shape and dtype.
        """
        normed = F.rms_norm(hidden_states.float(), (hidden_states.shape[-1],), eps=self.eps)
        return self.weight * normed.to(hidden_states.dtype)


class GattMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)).

    Args:
        config: The model's configuration: `hidden_size`, `intermediate_size` and `mlp_bias`.
    """

    def __init__(self, config: GattConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        """Apply the MLP.

        Args:
            x: Activations, (..., hidden_size).

        Returns:
            The MLP's output, (..., hidden_size).
        """
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class GattDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)).

    Args:
        config: The model's configuration (widths, heads, score function, biases, attention dropout, norm eps).
        layer_idx: The layer's index, under which its attention reads and writes the KV cache.
    """

    def __init__(self, config: GattConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = MaskedMultiHeadAttention(
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            score=config.score_function,
            bias=config.attention_bias,
            dropout=config.attention_dropout or 0.0,
            layer_idx=layer_idx,
        )
        self.mlp = GattMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: Tensor,
        position_embeddings: tuple[Tensor, Tensor],
        mask: Tensor | None = None,
        is_causal: bool = True,
        past_key_values: Cache | None = None,
        return_weights: bool = False,
        spans: list[list[tuple[int, int]]] | None = None,
        split_softmax: SplitSoftmax | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Run the block.

        Args:
            hidden_states: Activations, (B, T, C).
            position_embeddings: RoPE (cos, sin), each (B, T, D).
            mask: Bool attention mask, True where a query may attend, broadcastable to (B, H, T, Tk), cached keys
                included (default None: no mask).
            is_causal: Whether the plain causal mask applies (default True).
            past_key_values: The KV cache, which the attention updates (default None: no cache).
            return_weights: Whether to return the attention weights (default False).
            spans: Per row, the [start, end) segments of a packed row, for the per-segment fast path (default None).
            split_softmax: Boost the attention on the instruction's key columns (default None: no boost).

        Returns:
            The block's output, (B, T, C), and the attention weights, (B, H, T, Tk), or None unless asked for.
        """
        attn_out, weights = self.self_attn(
            self.input_layernorm(hidden_states),
            position_embeddings,
            mask,
            is_causal=is_causal,
            past_key_values=past_key_values,
            return_weights=return_weights,
            spans=spans,
            split_softmax=split_softmax,
        )
        hidden_states = hidden_states + attn_out
        hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states, weights


class GattPreTrainedModel(PreTrainedModel):
    """Weight init, checkpoint and gradient-checkpointing plumbing shared by the GAtt models."""

    config_class = GattConfig
    config: GattConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["GattDecoderLayer"]
    _skip_keys_device_placement = ["cache", "past_key_values"]
    _supports_sdpa = True

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)  # Linear, Embedding and the norms (matched by class name)
        if isinstance(module, RotaryEmbedding):
            inv_freq, _ = rope_inv_freq(self.config)
            init.copy_(module.inv_freq, inv_freq)
        elif isinstance(module, (GeneralScore, AdditiveScore)):
            if not any(getattr(p, "_is_hf_initialized", False) for p in module.parameters()):
                module.reset_parameters()


class GattModel(GattPreTrainedModel):
    """The decoder stack: embeddings -> layers -> final norm.

    Args:
        config: The model's configuration.
    """

    def __init__(self, config: GattConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList([GattDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        inv_freq, scaling = rope_inv_freq(config)
        self.rotary_emb = RotaryEmbedding(config.head_dim, inv_freq=inv_freq, scaling=scaling)
        self.gradient_checkpointing = False
        self.post_init()

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: Tensor | None = None,
        use_cache: bool | None = None,
        segment_ids: Tensor | None = None,
        output_attentions: bool = False,
        split_softmax: SplitSoftmax | None = None,
        past_key_values: Cache | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        """Run the decoder stack on token ids or embeddings.

        The KV cache goes back under the installed transformers' name for it (gatt/model/cache.py).

        Args:
            input_ids: Token ids, (B, T); give exactly one of `input_ids` and `inputs_embeds`.
            attention_mask: (B, past + T) with 1 on real tokens, or a 4-D bool mask used as is (default None).
            position_ids: Positions, (B, T) or (1, T); positions that restart at 0 mark packed dialogues (default
                None: with a 2-D `attention_mask`, the real tokens counted from 0, so a left-padded row's first real
                token is position 0; else past, past + 1, ...).
            cache: The KV cache (`past_key_values` before transformers 5.24; default None).
            inputs_embeds: Input embeddings, (B, T, C), instead of `input_ids`.
            use_cache: Whether to keep and return a KV cache, a new `DynamicCache` where none is given (default
                None: the config's `use_cache`); none is kept while training with gradient checkpointing.
            segment_ids: (B, T), one id per packed dialogue: tokens never attend across a dialogue boundary
                (default None: derived from `position_ids` when there is no cache and no `attention_mask`).
            output_attentions: Whether to return every layer's attention weights (default False).
            split_softmax: Every layer boosts its attention on the instruction's key columns (inference-time
                rival to GAtt, gatt/model/split_softmax.py; default None: no boost).
            past_key_values: The KV cache under its older name (default None).
            **kwargs: Ignored.

        Returns:
            `last_hidden_state` (B, T, C) after the final norm, the cache if used, `attentions` if asked (B, H, T, Tk).

        Raises:
            ValueError: Both or neither of `input_ids` and `inputs_embeds`, or of the two caches, are given; or a 2-D
                `attention_mask` does not cover the cached and new tokens.
        """
        cache = either_cache(cache, past_key_values)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # (B, T, C)
        batch, length, _ = inputs_embeds.shape
        cache, use_cache = self._cache(cache, use_cache)
        past_length = cache.get_seq_length() if cache is not None else 0
        key_length = past_length + length
        if position_ids is None:
            position_ids = self._default_position_ids(attention_mask, past_length, length, inputs_embeds.device)
        if segment_ids is None and past_length == 0 and attention_mask is None:
            segment_ids = segment_ids_from_position_ids(position_ids.expand(batch, -1))
        spans, mask, is_causal = self._masking(
            attention_mask, segment_ids, past_length, length, key_length, output_attentions, inputs_embeds.device
        )
        position_embeddings = self.rotary_emb(position_ids, dtype=inputs_embeds.dtype)  # 2 x (B, T, D)
        hidden_states = inputs_embeds
        attentions: list[Tensor] = []
        for layer in self.layers:
            hidden_states, weights = layer(
                hidden_states,
                position_embeddings,
                mask=mask,
                is_causal=is_causal,
                past_key_values=cache,
                return_weights=output_attentions,
                spans=spans,
                split_softmax=split_softmax,
            )
            if output_attentions:
                attentions.append(weights)
        return BaseModelOutputWithPast(
            last_hidden_state=self.norm(hidden_states),
            **cache_kwargs(cache if use_cache else None),
            attentions=tuple(attentions) if output_attentions else None,
        )

    def _cache(self, cache: Cache | None, use_cache: bool | None) -> tuple[Cache | None, bool]:
        """The cache forward writes to and whether it returns one: a new `DynamicCache` where none is given and one is
        used (`use_cache`, default the config's); none while training with gradient checkpointing (a layer replayed in
        backward would write its keys twice; transformers drops it too)."""
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            cache = None
        elif use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        return cache, use_cache

    @staticmethod
    def _default_position_ids(attention_mask: Tensor | None, past_length: int, length: int, device: Any) -> Tensor:
        if attention_mask is not None and attention_mask.ndim == 2:
            # Left padding: a dialogue's first real token is position 0.
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, past + T)
            return positions[:, past_length:]
        return torch.arange(past_length, past_length + length, device=device)[None]  # (1, T)

    def _masking(
        self,
        attention_mask: Tensor | None,
        segment_ids: Tensor | None,
        past_length: int,
        length: int,
        key_length: int,
        output_attentions: bool,
        device: torch.device,
    ) -> tuple[list[list[tuple[int, int]]] | None, Tensor | None, bool]:
        """The layers' (spans, mask, is_causal). Packed rows with nothing else to mask: scaled dot-product attention
        runs segment by segment (`spans`), with no (T, T) mask at all; otherwise the mask of `_attention_mask`."""
        if attention_mask is not None and attention_mask.ndim == 2 and attention_mask.shape[-1] != key_length:
            raise ValueError(
                f"attention_mask must cover the cached and new tokens: expected (batch, {key_length}), "
                f"got {tuple(attention_mask.shape)}"
            )
        if (
            segment_ids is not None
            and attention_mask is None
            and past_length == 0
            and not output_attentions
            and self.config.attention_window is None
            and self.config.score_function == "scaled_dot"
        ):
            return segment_spans(segment_ids), None, False
        mask, is_causal = self._attention_mask(attention_mask, segment_ids, length, key_length, device)
        return None, mask, is_causal

    def _attention_mask(
        self, attention_mask: Tensor | None, segment_ids: Tensor | None, length: int, key_length: int, device: Any
    ) -> tuple[Tensor | None, bool]:
        """The mask the layers share, and whether the plain causal fast path applies instead."""
        if attention_mask is not None and attention_mask.ndim == 4:
            return attention_mask, False
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None  # no padding: keep the kernel's causal fast path
        if attention_mask is None and segment_ids is None and self.config.attention_window is None:
            return None, True
        mask = build_attention_mask(
            length,
            key_length,
            padding_mask=attention_mask,
            segment_ids=segment_ids,
            window=self.config.attention_window,
            device=device,
        )
        return mask, False


def supervised_loss(
    lm_head: nn.Module, hidden_states: Tensor, labels: Tensor, num_items_in_batch: Tensor | int | None
) -> Tensor:
    """Next-token cross-entropy with the head applied only where there is a target (HF's ForCausalLMLoss, cheaper).

    Position t predicts labels[t + 1].

    Args:
        lm_head: The language-model head, hidden states -> logits over the vocabulary.
        hidden_states: The last hidden states, (B, T, D).
        labels: Token ids, (B, T), -100 where there is no loss.
        num_items_in_batch: Divides the summed loss when given (gradient accumulation); None: the loss is averaged
            over the targets.

    Returns:
        The loss, a scalar (the logits taken in fp32).
    """
    targets = F.pad(labels, (0, 1), value=-100)[:, 1:]  # (B, T): the token each position predicts
    keep = targets != -100  # (B, T)
    logits = lm_head(hidden_states[keep]).float()  # (N, V)
    loss = F.cross_entropy(logits, targets[keep], reduction="sum")
    denominator = keep.sum() if num_items_in_batch is None else num_items_in_batch
    return loss / denominator


class GattForCausalLM(GattPreTrainedModel, GenerationMixin):
    """The decoder stack with a language-model head; generates with a KV cache.

    Args:
        config: The model's configuration.
    """

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: GattConfig) -> None:
        super().__init__(config)
        self.model = GattModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        use_cache: bool | None = None,
        segment_ids: Tensor | None = None,
        output_attentions: bool = False,
        logits_to_keep: int | Tensor = 0,
        skip_logits: bool = False,
        split_softmax: SplitSoftmax | None = None,
        past_key_values: Cache | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """Logits (B, T, V); with `labels` (-100 = no loss), the mean next-token cross-entropy.

        Args:
            input_ids: Token ids, (B, T); give exactly one of `input_ids` and `inputs_embeds`.
            attention_mask: (B, past + T) with 1 on real tokens, or a 4-D bool mask used as is (default None).
            position_ids: Positions, (B, T) or (1, T) (default None: as `GattModel.forward` derives them).
            cache: The KV cache (`past_key_values` before transformers 5.24; default None).
            inputs_embeds: Input embeddings, (B, T, C), instead of `input_ids`.
            labels: Token ids, (B, T), -100 where there is no loss; position t predicts labels[t + 1] (default
                None: no loss).
            use_cache: Whether to keep and return a KV cache (default None: the config's `use_cache`).
            segment_ids: (B, T), one id per packed dialogue (default None: as `GattModel.forward` derives them).
            output_attentions: Whether to return every layer's attention weights (default False).
            logits_to_keep: The positions whose logits are computed: 0 every position (default), n > 0 the last n,
                a tensor the positions it indexes.
            skip_logits: `True` (training): with labels, the LM head runs only on the positions that have a
                target and no logits are returned; the loss is the same, for less time and memory (default False).
            split_softmax: Every layer boosts its attention on the instruction's key columns (default None: no
                boost).
            past_key_values: The KV cache under its older name (default None).
            **kwargs: Passed to the loss; `num_items_in_batch` divides the summed loss (gradient accumulation).

        Returns:
            `loss` (None without labels), `logits` (B, T, V) (None with `skip_logits` and labels), the cache, and
            with `output_attentions` the attention weights.

        Raises:
            ValueError: For the inputs `GattModel.forward` refuses.
        """
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=either_cache(cache, past_key_values),
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            segment_ids=segment_ids,
            output_attentions=output_attentions,
            split_softmax=split_softmax,
        )
        hidden_states = outputs.last_hidden_state
        if skip_logits and labels is not None:
            loss = supervised_loss(self.lm_head, hidden_states, labels, kwargs.get("num_items_in_batch"))
            return CausalLMOutputWithPast(
                loss=loss, **cache_kwargs(output_cache(outputs)), attentions=outputs.attentions
            )
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            hidden_states = hidden_states[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, Tensor):
            hidden_states = hidden_states[:, logits_to_keep]
        logits = self.lm_head(hidden_states)  # (B, T, V)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, **cache_kwargs(output_cache(outputs)), attentions=outputs.attentions
        )

    @classmethod
    def from_llama(cls, model_or_path: LlamaForCausalLM | str, **from_pretrained_kwargs: Any) -> GattForCausalLM:
        """Convert an in-memory `LlamaForCausalLM`, or load one from a path (e.g. `gguf_file=...`) and convert it.

        A GGUF file loads de-quantised: the converted weights are plain tensors, and the config claims no
        quantisation. The converted model keeps the Llama model's generation config, dtype and training mode.

        Args:
            model_or_path: A Llama model, or a path (or name) that `AutoModelForCausalLM.from_pretrained` loads.
            **from_pretrained_kwargs: Passed to `from_pretrained` when loading from a path (e.g. `gguf_file=...`).

        Returns:
            The `GattForCausalLM` with the Llama model's weights (tied again where the config ties embeddings).

        Raises:
            ValueError: When the model's `model_type` is not "llama".
        """
        if isinstance(model_or_path, (str, bytes)) or hasattr(model_or_path, "__fspath__"):
            llama = AutoModelForCausalLM.from_pretrained(model_or_path, **from_pretrained_kwargs)
        else:
            llama = model_or_path
        if getattr(llama.config, "model_type", None) != "llama":
            raise ValueError(f"from_llama expects a Llama model, got model_type {llama.config.model_type!r}")
        llama_config = llama.config.to_dict()
        # A GGUF file loads de-quantised: the converted weights are plain tensors, and saving must not claim otherwise.
        for key in ("model_type", "architectures", "transformers_version", "auto_map", "quantization_config"):
            llama_config.pop(key, None)
        config = GattConfig(**llama_config)
        with torch.device("meta"):
            model = cls(config)
        model.load_state_dict(llama.state_dict(), strict=True, assign=True)
        if config.tie_word_embeddings:
            model.tie_weights()
        inv_freq, _ = rope_inv_freq(config)
        model.model.rotary_emb.inv_freq = inv_freq.to(model.lm_head.weight.device)  # buffers are not in state_dicts
        model.generation_config = llama.generation_config
        return model.to(llama.dtype).train(llama.training)


AutoConfig.register("gatt", GattConfig)
AutoModel.register(GattConfig, GattModel)
AutoModelForCausalLM.register(GattConfig, GattForCausalLM)
