"""Train a small byte-level BPE tokenizer with a chat template that marks assistant tokens."""

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|begin|>"
# Also the end-of-turn token: every message ends with it, so generation stops at the end of a reply.
EOS_TOKEN = "<|end|>"
SYSTEM_TOKEN = "<|system|>"
USER_TOKEN = "<|user|>"
ASSISTANT_TOKEN = "<|assistant|>"
ROLE_TOKENS = (SYSTEM_TOKEN, USER_TOKEN, ASSISTANT_TOKEN)
# Order fixes the ids: pad must be 0 so zero-filled padding is already pad.
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, *ROLE_TOKENS)

# The {% generation %} block lets transformers build the assistant mask: the reply and its
# closing <|end|> are trained on (the model must learn to stop), the role header is not.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('Unknown role: ' ~ message['role'] ~ ' (expected system, user or assistant)') -}}"
    "{%- endif -%}"
    "{{- '<|' ~ message['role'] ~ '|>\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}{{- message['content'] ~ eos_token -}}{%- endgeneration -%}"
    "{%- else -%}"
    "{{- message['content'] ~ eos_token -}}"
    "{%- endif -%}"
    "{{- '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)

_BYTE_ALPHABET_SIZE = len(pre_tokenizers.ByteLevel.alphabet())


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 4096,
    min_frequency: int = 2,
    model_max_length: int = 2048,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts` and wrap it as a chat-ready PreTrainedTokenizerFast.

    The vocabulary holds the full byte alphabet, so every string is encodable, and the special tokens (pad at id
    0, bos, eos, which also ends each turn, and the role tokens).

    Args:
        texts: The training texts; empty ones are skipped.
        vocab_size: The vocabulary size, at least 256 byte symbols plus the special tokens (default 4096).
        min_frequency: How often a pair must occur to be merged (default 2).
        model_max_length: The tokenizer's maximum sequence length (default 2048).

    Returns:
        The tokenizer, with bos, eos and pad tokens, the role tokens as extra special tokens and `CHAT_TEMPLATE`,
        which marks assistant tokens.

    Raises:
        ValueError: When no text is non-empty, or `vocab_size` is below the byte alphabet plus the special tokens.
    """
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError("train_tokenizer expected at least one non-empty training text, got none")
    min_vocab = _BYTE_ALPHABET_SIZE + len(SPECIAL_TOKENS)
    if vocab_size < min_vocab:
        raise ValueError(
            f"vocab_size must be at least {min_vocab} (256 byte symbols + {len(SPECIAL_TOKENS)} special tokens), "
            f"got {vocab_size}"
        )

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        # The full byte alphabet makes every string encodable, even bytes absent from the corpus.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)

    # No bos-adding post-processor: the chat template writes bos itself, once.
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        extra_special_tokens=list(ROLE_TOKENS),  # v5 name; `additional_special_tokens` is deprecated
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
    )
