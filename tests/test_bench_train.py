"""train_vs_trl's premise: TRL's SFTTrainer (assistant_only_loss) trains exactly the tokens our collator trains.

On two hand-written GAtt records, for the embedded tokenizer's template (it has `{% generation %}` marks)
and for SmolLM2's ChatML template (it has none: the benchmark supplies TRL a marked training template):
the rendered token ids and the supervised tokens of TRL's prepared rows equal our collator's, and
TRL's padding-free batch keeps the dialogues apart (position ids restart at 0 for each).
"""

import bench_train_trl  # noqa: E402
import pytest

from gatt.data.collator import IGNORE_INDEX, GAttCollator
from gatt.model.tokenizer import train_tokenizer
from gatt.training.trainer import TrainConfig

# SmolLM2-135M-Instruct's chat template, as its GGUF file ships it.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

RECORDS = [
    {
        "id": "d-0",
        "instruction": "Always answer in French.",
        "instruction_short": "Language: French",
        "use_short": False,
        "messages": [
            {"role": "user", "content": "Tell me about rivers."},
            {"role": "assistant", "content": "Les rivières coulent vers la mer."},
            {"role": "user", "content": "And mountains?"},
            {"role": "assistant", "content": "Les montagnes sont hautes et froides."},
        ],
        "sampled_with_instruction": [True, True],
    },
    {
        "id": "d-1",
        "instruction": "Write every reply in upper case.",
        "instruction_short": "Format: all caps",
        "use_short": True,
        "messages": [
            {"role": "user", "content": "What is a library?"},
            {"role": "assistant", "content": "A PLACE FULL OF BOOKS."},
        ],
        "sampled_with_instruction": [True],
    },
]


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """SFTTrainer builds an Accelerator; other tests' process-wide state must not leak into it, nor its into theirs."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.mark.parametrize("template", ["embedded", "smollm2"])
def test_trl_trains_the_tokens_our_collator_trains(tmp_path, template):
    texts = [m["content"] for r in RECORDS for m in r["messages"]] + [r["instruction"] for r in RECORDS]
    tokenizer = train_tokenizer(texts * 4, vocab_size=300, model_max_length=512)
    if template == "smollm2":
        tokenizer.chat_template = SMOLLM2_TEMPLATE
        marked = bench_train_trl.training_template(tokenizer)
        assert marked is not None and "{% generation %}" in marked
        for record in RECORDS:  # the marked template renders the same text
            chat = GAttCollator(tokenizer).chat(record)
            assert tokenizer.apply_chat_template(
                chat, tokenize=False, chat_template=marked
            ) == tokenizer.apply_chat_template(chat, tokenize=False)
    else:
        assert bench_train_trl.training_template(tokenizer) is None  # the embedded template is marked already
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    collator = GAttCollator(tokenizer, mode="all", max_length=512, packing=True)
    assert collator.uses_generation_marks == (template == "embedded")  # ours: assistant masks, or prefix renders
    config = TrainConfig(
        output_dir=str(tmp_path / "ours"),
        max_steps=1,
        train_file="unused.jsonl",
        batch_size=2,
        tokenizer=str(tmp_path / "tokenizer"),
        max_length=512,
        model_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 512,
        },
    )
    # trl_trainer checks every prepared row against our collator (check_same_examples); checked here again, plainly.
    trainer = bench_train_trl.trl_trainer(1, 2, 512, "padding_free", tmp_path, config, collator, RECORDS, "cpu")
    order = bench_train_trl.batch_indices(len(RECORDS), 2, config.seed, 0)
    rows = [trainer.train_dataset[i] for i in range(len(order))]
    for row, index in zip(rows, order):
        record = RECORDS[index]
        (ours,) = collator.examples(record)
        assert row["input_ids"] == ours.input_ids
        assert row["labels"] == ours.labels
        text = tokenizer.decode(ours.input_ids)
        instruction = record["instruction_short" if record["use_short"] else "instruction"]
        assert text.count(instruction) == 1 and text.index(instruction) < text.index(record["messages"][0]["content"])
        supervised = tokenizer.decode([t for t in ours.labels if t != IGNORE_INDEX])  # every reply and its end of turn
        end = tokenizer.eos_token if template == "embedded" else "<|im_end|>"
        assert supervised == "".join(m["content"] + end for m in record["messages"] if m["role"] == "assistant")

    # One padding-free batch: one row, positions restarting per dialogue, the supervised tokens of our packed batch.
    batch = trainer.data_collator(rows)
    packed = collator([RECORDS[i] for i in order])
    lengths = [len(r["input_ids"]) for r in rows]
    assert batch["input_ids"].shape == (1, sum(lengths))
    assert (batch["position_ids"][0] == 0).nonzero().flatten().tolist() == [0, lengths[0]]
    assert int((batch["labels"] != IGNORE_INDEX).sum()) == int((packed["labels"] != IGNORE_INDEX).sum()) > 0
