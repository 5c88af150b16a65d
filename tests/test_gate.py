"""The answer gate: degenerate replies that pass an instruction's checks fail it; real answers pass."""

import pytest

from gatt.data.check_types import Check
from gatt.eval.gate import AnswerGate, GateConfig, GateItem, GateTurn, RelevanceScorer
from gatt.eval.non_answers import is_empty, is_salad, loops, repeated_share

SKY, BEES, QUAKE, CAMP = (
    "Why is the sky blue?",
    "How do bees make honey?",
    "What causes earthquakes?",
    "What should I pack for a weekend camping trip?",
)
OTHERS = (
    "How do I fix a flat bicycle tire?",
    "Can you recommend a book for a long train ride?",
    "How can I sleep better at night?",
)


def dialogue(*turns: tuple[str, str], kinds: tuple[str, ...] = ()) -> list[GateItem]:
    """Gate items of a dialogue's (user, reply) turns, each with the turns before it."""
    gate_turns = [GateTurn(user, reply, kinds[i] if kinds else "chat") for i, (user, reply) in enumerate(turns)]
    return [GateItem(turn, tuple(gate_turns[:i]), OTHERS) for i, turn in enumerate(gate_turns)]


def failed(items: list[GateItem], gate: AnswerGate | None = None) -> list[tuple[str, ...]]:
    return [v.failed for v in (gate or AnswerGate()).judge(items)]


# --- three degenerate replies: each passes its instruction's check ---------------------------------------


def test_the_opening_word_alone_every_turn_is_a_repeat():
    starts = Check("startswith", {"text": "Indeed"})
    items = dialogue((SKY, "Indeed"), (BEES, "Indeed."), (QUAKE, "Indeed!"))
    assert all(starts.passes(item.turn.reply) for item in items)
    assert failed(items) == [(), ("repeat",), ("repeat",)]  # turn 1: nothing to repeat yet, no scorer to judge it


def test_one_sentence_to_every_later_question_is_a_repeat_even_with_a_word_changed():
    limit = Check("max_words", {"n": 10})
    items = dialogue(
        (SKY, "Air scatters blue sunlight the most."),
        (BEES, "That is a very good question to think about."),
        (QUAKE, "That is a very good question to think about."),
        (CAMP, "That is a really good question to think about."),
    )
    assert all(limit.passes(item.turn.reply) for item in items)
    assert failed(items) == [(), (), ("repeat",), ("repeat",)]
    assert AnswerGate().judge(items)[3].repeats == 1  # the earlier turn it repeats


def test_a_looping_phrase_in_a_language_is_a_loop():
    french = "C'est la question de la lumière. C'est la question de la lumière. C'est la question"
    assert (
        loops(french) and loops("Aye, aye, aye, aye, aye, aye, aye") and loops("Das ist gut. Das ist gut. Das ist gut.")
    )
    # the same 5 words three times with something between them
    assert loops(
        "To fix it, get a flat tire on the road, and to get a flat tire on the road, you get a flat tire on the road."
    )
    assert failed(dialogue((SKY, french))) == [("loop",)]


@pytest.mark.parametrize("reply", ["", "   ", "...", "👍", "\n\n"])
def test_empty_replies(reply):
    assert is_empty(reply) and failed(dialogue((SKY, reply))) == [("empty",)]


# --- real answers it must keep ---------------------------------------------------------------------------


def test_real_answers_with_a_persona_a_sign_off_and_a_list_pass():
    items = dialogue(
        (SKY, "Arr, matey! The sky be blue because the air scatters the blue light of the sun most. Have a nice day!"),
        (
            BEES,
            "Arr, matey! The wee bees sip nectar from flowers and brew it into golden honey in the hive. Have a nice day!",
        ),
        (CAMP, "Arr! 1. A tent. 2. A sleeping bag. 3. A flashlight. 4. Water. 5. Food. Have a nice day!"),
        (QUAKE, "Les séismes viennent du glissement des plaques tectoniques les unes contre les autres."),
        (OTHERS[0], "Rayleigh's law. Rayleigh's law explains the sky, but for a tire you need a patch kit and a pump."),
    )
    assert failed(items) == [()] * 5
    assert not loops("Rayleigh Scavenger's Law. Rayleigh Scavenger's Law is a concept in physics about light.")


def test_repeated_share_counts_the_replys_words_found_in_blocks_of_the_earlier_one():
    assert repeated_share("Indeed", "Indeed, bees make honey.") == 1.0
    assert repeated_share("Bees make honey from nectar.", "The sky is blue.") == 0.0
    assert repeated_share("a b c d", "a b x y") == 0.5
    assert repeated_share("", "anything") == 0.0


def test_probe_answers_may_repeat_each_other_and_the_same_question_may_get_the_same_answer():
    items = dialogue(
        ("Who are you?", "I am Marie Curie."),
        (SKY, "Light scatters in the air, blue the most."),
        ("What is your name?", "I am Marie Curie."),
        (SKY, "Light scatters in the air, blue the most."),
        kinds=("probe", "chat", "probe", "chat"),
    )
    assert failed(items) == [()] * 4
    # but a chat reply that copies a probe answer is a repeat
    assert failed(
        dialogue(("Who are you?", "I am Marie Curie."), (BEES, "I am Marie Curie."), kinds=("probe", "chat"))
    )[1] == ("repeat",)


def test_on_topic_checks_judge_the_topic_where_a_turn_has_them():
    volcanoes = (Check("contains_any", {"words": ["volcano", "volcanoes"]}),)
    on = GateTurn("Tell me about volcanoes.", "Volcanoes: molten rock rises through them.", on_topic=volcanoes)
    off = GateTurn("Tell me about volcanoes.", "Coffee: it is made from roasted beans.", on_topic=volcanoes)
    probe = GateTurn(
        "Who are you?", "I am Napoleon.", "probe", on_topic=volcanoes
    )  # a probe is judged by its own checks
    assert failed([GateItem(on), GateItem(off), GateItem(probe)]) == [(), ("off_topic",), ()]


def test_a_template_answer_with_the_topic_changed_is_no_repeat_where_on_topic_checks_show_it():
    volcanoes = (Check("contains_any", {"words": ["volcanoes"]}),)
    coffee = (Check("contains_any", {"words": ["coffee"]}),)
    first = GateTurn(
        "Tell me about volcanoes.",
        "Volcanoes: a fascinating subject. There is always something new to learn.",
        on_topic=volcanoes,
    )
    swapped = GateTurn(
        "What do you know about coffee?",
        "Coffee: a fascinating subject. There is always something new to learn.",
        on_topic=coffee,
    )
    same_topic = GateTurn("What is coffee made of?", swapped.reply, on_topic=coffee)
    assert failed([GateItem(swapped, (first,))]) == [()]
    assert failed([GateItem(same_topic, (swapped,))]) == [
        ("repeat",)
    ]  # a second question on coffee: the same answer again
    # Without on-topic checks the near copy is a repeat (SmolLM2's "not available for X ... books about X" template).
    bare = [GateTurn(t.user, t.reply) for t in (first, swapped)]
    assert failed([GateItem(bare[1], (bare[0],))]) == [("repeat",)]
    # A real model's teacher drops the exception (data_gen --strict-repeats): the template is a repeat there.
    assert failed([GateItem(swapped, (first,))], AnswerGate(GateConfig(topic_change_exempts=False))) == [("repeat",)]


def test_the_config_moves_the_bars():
    items = dialogue((SKY, "a b c d e f g h"), (BEES, "a b c d e f x y"))
    assert failed(items) == [(), ("repeat",)]  # 6 of 8 words: 75%
    assert failed(items, AnswerGate(GateConfig(repeat_share=0.8))) == [(), ()]


# --- relevance by likelihood, for user turns without on-topic checks ----------------------------------


@pytest.fixture(scope="module")
def scorer(smollm2) -> RelevanceScorer:
    model, tokenizer = smollm2  # SmolLM2-135M-Instruct, as `gatt.model.pretrained.load_smollm2()` returns it
    return RelevanceScorer(model, tokenizer)


def test_relevance_fails_filler_refusals_and_off_topic_replies_and_keeps_answers(scorer):
    replies = {
        "Bees collect nectar from flowers and store it in the hive, where they fan it until it becomes honey.": (),
        "Les abeilles butinent le nectar des fleurs et le transforment en miel dans la ruche.": (),
        "Arr matey, the wee bees sip nectar from flowers and turn it into golden honey in their hive, arr!": (),
        "That's a great question! Let me think about it.": ("off_topic",),
        "I'm sorry, I can't help with that.": ("off_topic",),
        "The sky looks blue because air molecules scatter blue light more than red light.": ("off_topic",),
        "Indeed": ("off_topic",),
    }
    items = [GateItem(GateTurn(BEES, reply), (), OTHERS) for reply in replies]
    verdicts = AnswerGate(scorer=scorer).judge(items)
    assert [v.failed for v in verdicts] == list(replies.values())
    assert all(v.relevance is not None for v in verdicts)
    # scores are cached: judging again gives the same numbers without a second pass
    assert [v.relevance for v in AnswerGate(scorer=scorer).judge(items)] == [v.relevance for v in verdicts]


def test_the_strict_gate_asks_word_salad_that_names_the_topic_for_the_likelihood_contrast_too(scorer):
    honey = (Check("contains_any", {"words": ["honey", "miel"]}),)
    replies = {  # passes the topic word; the reader's label (gate audit); the strict gate's verdict
        "Bees collect nectar from flowers and store it in the hive, where they fan it until it becomes honey.": (),
        "La bonne honey est un je ne sais pas, cela n'est pas leur. Les défaut sincronises et les autres qui vont "
        "à la foi (là-la) (les mauvaise).": ("off_topic",),
    }
    items = [GateItem(GateTurn(BEES, reply, on_topic=honey), (), OTHERS) for reply in replies]
    assert failed(items, AnswerGate(scorer=scorer)) == [(), ()]  # the topic word alone: both pass
    strict = AnswerGate(GateConfig.strict(), scorer).judge(items)
    assert [v.failed for v in strict] == list(replies.values())
    assert all(v.relevance is not None for v in strict)  # the contrast was measured although the checks passed
    strict_config = GateConfig.strict()
    assert (strict_config.topic_change_exempts, strict_config.relevance_both) == (False, True)
    # A reply that fails its topic words is off topic under either gate, without a contrast to measure.
    coffee = GateItem(GateTurn(BEES, "Coffee: it is made from roasted beans.", on_topic=honey), (), OTHERS)
    [verdict] = AnswerGate(GateConfig.strict(), scorer).judge([coffee])
    assert verdict.failed == ("off_topic",) and verdict.relevance is None


@pytest.mark.parametrize("architecture", ["gatt", "llama"])
def test_batched_log_likelihoods_equal_one_pair_at_a_time(architecture):
    """The scorer computes logits only where a reply token is predicted: the same log-likelihoods, for the library's
    model and a Hugging Face one."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gatt.model.modeling import GattConfig, GattForCausalLM
    from gatt.model.tokenizer import train_tokenizer

    tokenizer = train_tokenizer([f"{q} The answer is {i}." for i, q in enumerate(OTHERS * 20)], vocab_size=300)
    config = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = (
        GattForCausalLM(GattConfig(**config)) if architecture == "gatt" else LlamaForCausalLM(LlamaConfig(**config))
    ).eval()
    pairs = [
        (q, r)
        for q in (SKY, BEES, OTHERS[0])
        for r in ("Blue light scatters.", "Bees make honey from nectar, a lot.", "Hi")
    ]
    batched = RelevanceScorer(model, tokenizer, batch_size=4, max_reply_tokens=6).log_likelihoods(pairs)
    for (question, reply), (total, count) in zip(pairs, batched):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        target = tokenizer(reply, add_special_tokens=False)["input_ids"][:6]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + target])).logits[0, len(prompt) - 1 : -1]  # (T_reply, V)
        direct = logits.log_softmax(-1).gather(-1, torch.tensor(target)[:, None]).sum()
        assert count == len(target) and total == pytest.approx(float(direct), abs=1e-4)


# --- messages without topic words (the second gate audit): echoes, templates, list loops, word salad; strict gate --

STRICT = AnswerGate(GateConfig.strict())
RUN = "Is it better to run in the morning or in the evening?"


def test_an_echo_of_the_question_fails_and_a_terse_answer_passes():
    echo = GateItem(GateTurn(RUN, "It's better to run in the morning or in the evening."))
    terse = GateItem(GateTurn(RUN, "Yes, it's better to run in the morning."))
    answer = GateItem(GateTurn(RUN, "Morning runs suit most people: cooler air, and the habit sticks."))
    assert failed([echo, terse, answer], STRICT) == [("echo",), (), ()]
    assert failed([echo]) == [()]  # the default gate (the embedded model's, topic words in every turn) keeps it
    # a restated question that drops its contraction's "s" (a GRPO-trained SmolLM2's reply under "Word limit: 40")
    castles = "What's the most surprising thing about castles?"
    stub = GateItem(GateTurn(castles, "The most surprising thing about castles..."))
    answered = GateItem(GateTurn(castles, "The most surprising thing about castles is how many were never attacked."))
    assert failed([stub, answered], STRICT) == [("echo",), ()]


def test_an_opening_kept_while_the_tail_changes_is_a_template_unless_the_instruction_asks_for_it():
    opening = "A question that has been debated by many people throughout history. But, in the end, the answer is "
    first = GateTurn(SKY, opening + "very simple: light scatters, and blue light scatters the most of all.")
    later = GateTurn(BEES, opening + "that bees turn nectar into honey by fanning it dry in the hive.")
    assert failed([GateItem(later, (first,))], STRICT) == [("template",)]
    assert failed([GateItem(later, (first,))]) == [()]
    # a shared run of 12 words anywhere, not only at the start
    middle = "so the short answer is that nature always finds a way to keep going"
    a = GateTurn(SKY, f"Light scatters in the air, {middle}.")
    b = GateTurn(BEES, f"Bees turn nectar into honey in the hive, {middle}.")
    assert failed([GateItem(b, (a,))], STRICT) == [("template",)]
    # the opening the instruction requires is no template
    required = "Dear traveler, here is what I think about your question:"
    c = GateTurn(SKY, f"{required} light scatters off air molecules, and blue scatters most.")
    d = GateTurn(BEES, f"{required} bees evaporate nectar and store it in wax cells.")
    assert failed([GateItem(d, (c,), instruction=f"Start every reply with '{required}'")], STRICT) == [()]
    assert failed([GateItem(d, (c,))], STRICT) == [("template",)]


@pytest.mark.parametrize(
    ("reply", "looping"),
    [
        ("1. 1. **Sweep**: 2. 2. **Sweep**: 3. 3.", True),
        ("Steps:\n1. Sweep the floor.\n2. Sweep the floor.\n3. Mop it.", True),
        ("Steps:\n1. Sweep the floor.\n2. Mop it with warm water.\n3. Let it dry.", False),
        ("I paid 2.5 dollars for 3 apples.", False),
    ],
)
def test_a_list_whose_items_repeat_loops(reply, looping):
    assert loops(reply) is looping


@pytest.mark.parametrize(
    ("reply", "salad"),
    [
        ("Pancards de mochi is alibidos que parecen una manzilla de papa en manzillos the cooking of papas.", True),
        ("Pero te hablar en es, para esto parecillo. Cometié que el primeritorejo del servido de la cabana.", True),
        ("Las abejas recogen el néctar de las flores y lo transforman en miel dentro de la colmena.", False),
        ("Bienen sammeln Nektar aus den Blumen und machen daraus in ihrem Stock den Honig.", False),
        ("BEES COLLECT NECTAR FROM FLOWERS AND TURN IT INTO HONEY INSIDE THE HIVE.", False),
        ("Dejarte a la ocho.", False),  # under 4 words of 3+ letters: not judged
    ],
)
def test_word_salad_is_a_reply_whose_words_its_language_lacks(reply, salad):
    assert is_salad(reply) is salad
    assert ("salad" in failed([GateItem(GateTurn(BEES, reply))], STRICT)[0]) is salad
