"""ChatBatch: k candidates from one encoded prompt, keeping one, and continuing from the kept cache row."""

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.cache_utils import DynamicLayer

from gatt.model.cache import GrowingLayer
from gatt.model.generation import ChatBatch, decoder_options
from gatt.model.modeling import GattConfig, GattForCausalLM
from gatt.model.sampling import NucleusWarper, Sampler
from gatt.model.tokenizer import train_tokenizer

TEXTS = [f"Tell me about topic {i}. The weather is nice and tennis is fun, {i * 7} times." for i in range(300)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, vocab_size=400)


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    config = GattConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return GattForCausalLM(config).eval()


def prompt(tokenizer, messages):
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def greedy(model, tokenizer, messages, max_new_tokens=10) -> str:
    ids = prompt(tokenizer, messages)
    out = model.generate(
        torch.tensor([ids]),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True).strip()


def test_greedy_candidates_are_equal_and_continue_like_reencoding(model, tokenizer):
    chat = ChatBatch(model, tokenizer, Sampler(do_sample=False), max_new_tokens=10)
    histories = {key: [{"role": "user", "content": TEXTS[key]}] for key in (3, 8, 11)}
    for turn in range(3):
        out = chat.generate({key: prompt(tokenizer, h) for key, h in histories.items()}, k=3)
        assert set(out) == set(histories)
        for key, history in histories.items():
            texts = [c.text for c in out[key]]
            assert texts == [greedy(model, tokenizer, history)] * 3  # one prompt encoding, three cache rows
        chat.keep({key: turn % 3 for key in histories})
        for key, history in histories.items():
            history += [
                {"role": "assistant", "content": out[key][0].text},
                {"role": "user", "content": TEXTS[key + turn + 20]},
            ]


def test_sampled_candidates_differ_and_the_kept_one_is_the_history(model, tokenizer):
    chat = ChatBatch(model, tokenizer, Sampler(do_sample=True, temperature=1.0, top_p=1.0, seed=0), max_new_tokens=10)
    history = [{"role": "user", "content": TEXTS[0]}]
    out = chat.generate(
        {"a": prompt(tokenizer, history), "b": prompt(tokenizer, [{"role": "user", "content": TEXTS[1]}])}, k=4
    )
    texts = [c.text for c in out["a"]]
    assert len(set(texts)) > 1
    chat.keep({"a": 2})  # "b" is dropped
    assert chat.keys == ["a"]
    history += [{"role": "assistant", "content": texts[2]}, {"role": "user", "content": TEXTS[5]}]
    chat.sampler = Sampler(do_sample=False)
    [candidate] = chat.generate({"a": prompt(tokenizer, history)})["a"]
    assert candidate.text == greedy(model, tokenizer, history)
    with pytest.raises(ValueError, match="new"):
        chat.generate({"a": prompt(tokenizer, history), "c": prompt(tokenizer, history)})


@pytest.mark.parametrize("processor", [{"no_repeat_ngram_size": 2}, {"repetition_penalty": 1.5}])
def test_loop_processors_act_on_the_reply_as_hugging_face_does_without_a_prompt(model, tokenizer, processor):
    ids = prompt(tokenizer, [{"role": "user", "content": TEXTS[3]}])
    plain = ChatBatch(model, tokenizer, Sampler(do_sample=False), max_new_tokens=24).generate({0: ids})[0][0].tokens
    assert len(set(zip(plain, plain[1:]))) < len(plain) - 1  # this random model loops greedily
    [candidate] = ChatBatch(model, tokenizer, Sampler(do_sample=False, **processor), max_new_tokens=24).generate(
        {0: ids}
    )[0]
    # generate() from embeddings has no prompt ids, so its processors see the reply alone, as ChatBatch's do
    with pytest.warns(UserWarning, match="newly generated tokens"):
        reference = model.generate(
            inputs_embeds=model.get_input_embeddings()(torch.tensor([ids])),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=24,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **processor,
        )
    assert candidate.tokens == reference[0].tolist() != plain


def test_a_choice_is_required_before_the_next_turn(model, tokenizer):
    chat = ChatBatch(model, tokenizer, Sampler(do_sample=False), max_new_tokens=4)
    ids = prompt(tokenizer, [{"role": "user", "content": TEXTS[0]}])
    chat.generate({0: ids}, k=2)
    with pytest.raises(RuntimeError, match="keep"):
        chat.generate({0: ids})


def test_growing_cache_layer_holds_what_concatenation_holds():
    torch.manual_seed(0)
    grown, reference = GrowingLayer(), DynamicLayer()
    steps = [
        (3, 5),
        (3, 1),
        (3, 70),
        (3, 1),
        ("select", [2, 0]),
        (2, 1),
        ("repeat", 2),
        (4, 3),
        (4, 1),
        ("keep", [1, 3]),
        (2, 1),
        (2, 60),
        ("keep", [1]),
        (1, 2),
    ]
    for step, arg in steps:
        if step == "keep":  # one index_select per buffer, room kept
            grown.keep_rows(torch.tensor(arg))
            reference.batch_select_indices(torch.tensor(arg))
        elif step == "select":
            for layer in (grown, reference):
                layer.batch_select_indices(torch.tensor(arg))
        elif step == "repeat":
            for layer in (grown, reference):
                layer.batch_repeat_interleave(arg)
        else:
            keys, values = torch.randn(step, 2, arg, 8), torch.randn(step, 2, arg, 8)  # (B, H_kv, T_new, D)
            got, want = grown.update(keys, values), reference.update(keys, values)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
            assert grown.get_seq_length() == reference.get_seq_length()
    assert grown._buffers[0].shape[-2] > grown.get_seq_length()  # room left: the next token copies nothing


def test_growing_cache_layer_grows_by_a_quarter_and_rarely():
    """Room for a quarter more at each rebuild: a long history never holds twice its size (a teacher's 64 rows of
    2,000-token SmolLM2 histories ran a 24 GB machine out of memory with doubling), and copies stay rare."""
    layer, capacities = GrowingLayer(), []
    for step in range(2000):
        layer.update(torch.zeros(2, 1, 1 if step else 100, 4), torch.zeros(2, 1, 1 if step else 100, 4))
        capacity = layer._buffers[0].shape[-2]
        if not capacities or capacity != capacities[-1]:
            capacities.append(capacity)
            assert capacity <= max(64, layer.get_seq_length() * 5 // 4 + 1), (capacity, layer.get_seq_length())
    assert len(capacities) <= 20 and capacities[-1] >= 2100


@pytest.mark.parametrize("sampled", [False, True])
def test_dropping_stopped_rows_writes_what_decoding_every_row_writes(model, tokenizer, sampled):
    """shrink=True (stopped rows leave the decoding batch, holes compacted each turn) vs the path that decodes
    every row to the end: the same tokens, greedy or seeded sampling, and the same attention shares."""

    def run(shrink: bool) -> tuple[list[dict], ChatBatch]:
        sampler = Sampler(do_sample=sampled, temperature=1.0, top_p=0.9, seed=3, repetition_penalty=1.3)
        chat = ChatBatch(model, tokenizer, sampler, max_new_tokens=12, measure_attention=True, shrink=shrink)
        chat.stops = {
            t for t in range(len(tokenizer)) if t % 5 == 0
        }  # this random model's rows stop at different steps
        histories = {key: [{"role": "user", "content": TEXTS[key]}] for key in range(6)}
        turns = []
        for turn in range(3):
            out = chat.generate(
                {key: prompt(tokenizer, h) for key, h in histories.items()},
                marked={key: [1, 2, 3] for key in histories},
            )
            turns.append(out)
            for key, history in histories.items():
                history += [
                    {"role": "assistant", "content": out[key][0].text},
                    {"role": "user", "content": TEXTS[key + turn + 30]},
                ]
        return turns, chat

    (shrunk, chat), (plain, plain_chat) = run(True), run(False)
    assert [{k: c[0].tokens for k, c in t.items()} for t in shrunk] == [
        {k: c[0].tokens for k, c in t.items()} for t in plain
    ]
    assert all(len({len(c[0].tokens) for c in t.values()}) > 1 for t in plain)  # replies of different lengths
    for ours, theirs in zip(shrunk, plain):
        for key in ours:  # a reply that stopped at its first token reads nothing: no share (None) on either side
            assert (ours[key][0].attention is None) == (theirs[key][0].attention is None)
            if ours[key][0].attention is not None:
                torch.testing.assert_close(torch.tensor(ours[key][0].attention), torch.tensor(theirs[key][0].attention))
    # every row's real columns are packed to the left: no holes but at a row's end, a narrower cache
    lengths = chat.mask.sum(1)
    assert torch.equal(chat.mask, (torch.arange(chat.mask.shape[1]) < lengths[:, None]).long())
    assert chat.mask.shape[1] == lengths.max() < plain_chat.mask.shape[1]
    assert torch.equal(lengths, plain_chat.mask.sum(1))


def test_candidates_sharing_their_row_sample_what_repeated_rows_sample(model, tokenizer):
    """k candidates as k queries of their dialogue's one cache row vs each candidate in a cache row of its own
    (k copies of the prompt, re-encoded every turn): from the same seed, the same tokens, turn after turn, with
    candidates that stop at different steps; the kept candidate's cache is its history's, holes compacted."""
    k = 4
    ours = ChatBatch(model, tokenizer, Sampler(do_sample=True, temperature=1.0, seed=7), max_new_tokens=12)
    reference_sampler = Sampler(do_sample=True, temperature=1.0, seed=7)
    stops = {t for t in range(len(tokenizer)) if t % 7 == 0}  # this random model's candidates stop at different steps
    ours.stops = stops
    histories = {key: [{"role": "user", "content": TEXTS[key]}] for key in range(5)}
    lengths = set()
    for turn in range(3):
        prompts = {key: prompt(tokenizer, h) for key, h in histories.items()}
        out = ours.generate(prompts, k=k)
        assert ours.candidates is not None and ours.keys == list(prompts)  # one cache row per dialogue
        reference = ChatBatch(model, tokenizer, reference_sampler, max_new_tokens=12)
        reference.stops = stops
        theirs = reference.generate({(key, c): prompts[key] for key in prompts for c in range(k)})
        assert {key: [c.tokens for c in out[key]] for key in prompts} == {
            key: [theirs[key, c][0].tokens for c in range(k)] for key in prompts
        }
        lengths |= {len(c.tokens) for key in prompts for c in out[key]}
        chosen = {key: (key + turn) % k for key in prompts if key != turn}  # one dialogue dropped a turn
        ours.keep(chosen)
        histories = {
            key: histories[key]
            + [
                {"role": "assistant", "content": out[key][chosen[key]].text},
                {"role": "user", "content": TEXTS[key + turn + 40]},
            ]
            for key in chosen
        }
        assert ours.keys == list(chosen)
        assert (
            [row.fed for row in ours.rows]
            == [  # its prompt and the kept reply but its last draw (stop or 12th)
                prompts[key] + out[key][chosen[key]].tokens[:-1] for key in chosen
            ]
        )
    assert len(lengths) > 2  # replies of several lengths
    fresh = ChatBatch(model, tokenizer, Sampler(do_sample=False), max_new_tokens=1)
    fresh.generate({key: ours.rows[i].fed for i, key in enumerate(ours.keys)})
    for layer, reference_layer in zip(ours.cache.layers, fresh.cache.layers):  # the same keys, holes aside
        for i, row in enumerate(ours.rows):
            real = reference_layer.keys[i][:, fresh.mask[i, : reference_layer.keys.shape[2]].bool()]
            torch.testing.assert_close(layer.keys[i][:, row.columns], real[:, : len(row.columns)])


def test_compaction_frees_each_old_layer_before_packing_the_next(model, tokenizer, monkeypatch):
    """Compacting the cache holds the old (K, V) of a layer or two beside the new cache, not a second whole cache:
    when layer n is assigned its packed rows, the old tensors of layers before n (the rows still decoding and
    the rows set aside) are gone (a 20-turn SmolLM2 rollout's peak memory halves)."""
    alive_before: list[int] = []  # at each assign: how many old tensors of the layers before it are still alive
    old_refs: list[list[weakref.ref]] = []  # per layer: the old tensors being compacted
    assigned = [0]  # layers assigned in the compaction under way
    compact, assign = ChatBatch._compact, GrowingLayer.assign

    def tracking_compact(self, groups):
        old_refs[:] = [
            [weakref.ref(t) for _, layers in groups for t in layers[n]] for n in range(len(self.cache.layers))
        ]
        assigned[0] = 0
        compact(self, groups)

    def tracking_assign(self, keys, values, spare):
        alive_before.append(sum(r() is not None for refs in old_refs[: assigned[0]] for r in refs))
        assigned[0] += 1
        assign(self, keys, values, spare)

    monkeypatch.setattr(ChatBatch, "_compact", tracking_compact)
    monkeypatch.setattr(GrowingLayer, "assign", tracking_assign)
    chat = ChatBatch(model, tokenizer, Sampler(do_sample=False), max_new_tokens=12)
    chat.stops = {t for t in range(len(tokenizer)) if t % 5 == 0}  # rows stop at different steps: some are set aside
    histories = {key: [{"role": "user", "content": TEXTS[key]}] for key in range(6)}
    for _ in range(3):
        out = chat.generate({key: prompt(tokenizer, h) for key, h in histories.items()})
        for key, history in histories.items():
            history += [
                {"role": "assistant", "content": out[key][0].text},
                {"role": "user", "content": TEXTS[key + 40]},
            ]
    assert len(alive_before) >= 2 * len(model.model.layers)  # compacted on at least two turns
    assert alive_before == [0] * len(alive_before)


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.95])
def test_nucleus_warper_keeps_the_tokens_hugging_faces_top_p_keeps(top_p):
    from transformers.generation import TopPLogitsWarper

    torch.manual_seed(0)
    scores = torch.cat([torch.randn(16, 5000) * 4, torch.randn(16, 5000) * 0.3])  # peaked rows, then flat ones
    warper = NucleusWarper(top_p, candidates=256)
    wide = scores.softmax(-1).topk(256).values.sum(-1) < top_p
    assert 0 < int(wide.sum()) < len(scores)  # both the top-k path and the full-sort fallback are exercised
    ours, theirs = warper(None, scores), TopPLogitsWarper(top_p)(None, scores)
    kept = ours.isfinite()
    assert torch.equal(kept, theirs.isfinite()) and torch.equal(ours[kept], scores[kept])
    assert torch.equal(NucleusWarper(1.0)(None, scores), scores)


class HostTraffic(TorchDispatchMode):
    """Counts reads of tensor data to the host (`item`, `bool`, `tolist`) and tensors made from host data
    (`torch.tensor(list)`, indexing by a list): on a GPU each is a blocking round trip or a copy."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = self.creations = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        elif func is torch.ops.aten.lift_fresh.default:
            self.creations += 1
        return func(*args, **(kwargs or {}))


def host_traffic(model, tokenizer, rows: int, steps: int, monkeypatch, **options) -> tuple[int, int]:
    chat = ChatBatch(model, tokenizer, Sampler(do_sample=False), max_new_tokens=steps, **options)
    chat.stops = {-1}  # no row stops: every step decodes every row
    prompts = {key: prompt(tokenizer, [{"role": "user", "content": TEXTS[key]}]) for key in range(rows)}
    traffic, tolist = HostTraffic(), torch.Tensor.tolist

    def counted_tolist(tensor):
        traffic.reads += 1
        return tolist(tensor)

    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    with traffic:
        chat.generate(prompts, marked={key: [1, 2] for key in prompts})
    monkeypatch.undo()
    return traffic.reads, traffic.creations


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("probe", [False, True])
def test_a_decoding_step_reads_the_device_once_whatever_the_batch(model, tokenizer, monkeypatch, probe, static):
    """One step's traffic (the difference between a 10-token and a 4-token reply, over 6 steps): at most one read
    (its drawn tokens) and no tensor from host data, with 4 rows as with 32, attention probe on or off, growing
    or static cache."""
    per_step = []
    for rows in (4, 32):
        (long_reads, long_made), (short_reads, short_made) = (
            host_traffic(model, tokenizer, rows, steps, monkeypatch, measure_attention=probe, static=static)
            for steps in (10, 4)
        )
        per_step.append(((long_reads - short_reads) / 6, (long_made - short_made) / 6))
    assert per_step[0] == per_step[1], per_step
    reads, creations = per_step[0]
    assert reads + creations <= 2 and reads <= 1, per_step


def chat_turns(model, tokenizer, turns: int = 3, rows: int = 6, **options) -> tuple[list[dict], ChatBatch]:
    """Three turns of `rows` dialogues, greedy, rows stopping at different steps, the attention probe on."""
    chat = ChatBatch(model, tokenizer, Sampler(do_sample=False), max_new_tokens=12, measure_attention=True, **options)
    chat.stops = {t for t in range(len(tokenizer)) if t % 5 == 0}  # this random model's rows stop at different steps
    histories = {key: [{"role": "user", "content": TEXTS[key]}] for key in range(rows)}
    out = []
    for turn in range(turns):
        replies = chat.generate(
            {key: prompt(tokenizer, h) for key, h in histories.items()}, marked={key: [1, 2, 3] for key in histories}
        )
        out.append({key: (c[0].tokens, c[0].attention) for key, c in replies.items()})
        for key, history in histories.items():
            history += [
                {"role": "assistant", "content": replies[key][0].text},
                {"role": "user", "content": TEXTS[key + turn + 30]},
            ]
    return out, chat


def assert_same_turns(ours: list[dict], theirs: list[dict]) -> None:
    assert [{k: v[0] for k, v in t.items()} for t in ours] == [{k: v[0] for k, v in t.items()} for t in theirs]
    for mine, other in zip(ours, theirs):
        for key, (_, attention) in mine.items():
            assert (attention is None) == (other[key][1] is None)
            if attention is not None:
                torch.testing.assert_close(torch.tensor(attention), torch.tensor(other[key][1]))


def test_static_decoding_writes_what_the_growing_cache_writes(model, tokenizer):
    """Preallocated buffers written in place, every row decoded to the reply's end: the same tokens and attention
    shares as the growing cache that drops stopped rows."""
    growing, _ = chat_turns(model, tokenizer)
    static, chat = chat_turns(model, tokenizer, static=True)
    assert_same_turns(static, growing)
    assert any(len({len(tokens) for tokens, _ in turn.values()}) > 1 for turn in growing)  # rows stop apart


def test_the_decoding_step_compiles_whole_and_writes_the_same_tokens(model, tokenizer):
    """`torch.compile(decode_step, fullgraph=True)` (here with the eager backend: the graph dynamo captures, run
    as is) raises on any graph break; its replies equal the uncompiled step's."""
    torch._dynamo.reset()
    eager, _ = chat_turns(model, tokenizer, turns=2, static=True)
    compiled, _ = chat_turns(model, tokenizer, turns=2, compile_step={"backend": "eager"})
    assert_same_turns(compiled, eager)


def test_the_graphed_step_feeds_its_own_inputs_and_writes_the_same_tokens(model, tokenizer):
    """`graphs`: each reply's step owns its inputs (copied in at every step) and returns the same output tensors
    at every call, as a replayed CUDA graph does (on a CPU nothing is recorded): the same tokens and probe shares
    as the plain static step."""
    static, _ = chat_turns(model, tokenizer, static=True)
    graphed, chat = chat_turns(model, tokenizer, graphs=True)
    assert chat.static and chat.graphs
    assert_same_turns(graphed, static)


def test_static_decoding_needs_the_library_model(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    with pytest.raises(ValueError, match="static decoding needs the library's model"):
        ChatBatch(llama, tokenizer, Sampler(do_sample=False), max_new_tokens=4, static=True)


def test_decoder_options_pick_the_path_for_the_device(model):
    assert decoder_options(model, "auto") == {} and decoder_options(model, "growing") == {}  # a CPU: growing
    assert decoder_options(model, "static") == {"static": True}
    for decoder in ("graphs", "compiled"):
        with pytest.raises(ValueError, match=f"decoder {decoder} replays CUDA graphs"):
            decoder_options(model, decoder)
    with pytest.raises(ValueError, match="decoder must be one of"):
        decoder_options(model, "fast")
