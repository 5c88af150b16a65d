"""The KV cache's keyword, whatever the transformers version.

transformers 5.24 renamed the cache a model takes and returns from `past_key_values` to `cache`:
`generate()` passes `cache=`, outputs carry `.cache`, and the old name still works for Hugging Face
models with a deprecation warning. A model that takes only one name loses the cache under the other
(it falls into `**kwargs`, and every decoding step then sees only its last token). The library's model
takes both; the project's own calls pass the name the installed transformers uses, so no run warns.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

# "cache" on transformers >= 5.24, "past_key_values" before.
CACHE_KWARG: str = "cache" if "cache" in {f.name for f in fields(CausalLMOutputWithPast)} else "past_key_values"


def cache_kwargs(cache: Cache | None) -> dict[str, Cache | None]:
    """`model(**cache_kwargs(cache))`: the cache under the name the installed transformers uses."""
    return {CACHE_KWARG: cache}


def output_cache(output: Any) -> Cache | None:
    """The cache a model's output carries (`.cache` or `.past_key_values`, by version)."""
    return getattr(output, CACHE_KWARG, None)


def either_cache(cache: Cache | None, past_key_values: Cache | None) -> Cache | None:
    """One cache from a forward call that may name it either way; both at once is an error."""
    if cache is not None and past_key_values is not None:
        raise ValueError("pass the KV cache as `cache` or as `past_key_values`, not both")
    return cache if cache is not None else past_key_values


__all__ = ["CACHE_KWARG", "cache_kwargs", "either_cache", "output_cache"]
