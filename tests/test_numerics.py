"""gatt.model.numerics: bf16 and int8 dynamic quantisation for generation, beside the exact path."""

import copy

import pytest
import torch
from torch import nn

from gatt.model.cache import output_cache
from gatt.model.numerics import for_inference
from tests.test_modeling import random_ids, tiny_llama


def test_exact_is_the_model_itself() -> None:
    model = tiny_llama()
    assert for_inference(model, "exact") is model


def exact_and(library_model: bool, numerics: str) -> tuple[nn.Module, nn.Module]:
    """A tiny Llama (or the library's model converted from it) and a copy made ready in `numerics`."""
    from gatt import GattForCausalLM

    llama = tiny_llama()
    model = GattForCausalLM.from_llama(llama) if library_model else llama
    exact = copy.deepcopy(model)
    return exact, for_inference(model, numerics)


@pytest.mark.parametrize("library_model", [False, True])
def test_int8_quantises_every_linear_layer_and_stays_close(library_model: bool) -> None:
    exact, quantised = exact_and(library_model, "int8")
    assert not any(type(m) is nn.Linear for m in quantised.modules())  # projections, MLP and the LM head
    assert (
        sum(type(m).__name__ == "Linear" and "quantized" in type(m).__module__ for m in quantised.modules())
        == 3 * 7 + 1
    )
    ids = random_ids(2, 12)
    with torch.no_grad():
        expected, got = exact(ids).logits, quantised(ids).logits
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()  # int8 error, not another model
    assert not torch.equal(got, expected)
    out = quantised.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 17)


@pytest.mark.parametrize("library_model", [False, True])
def test_bf16_casts_weights_and_keeps_the_librarys_attention_fp32_and_stays_close(library_model: bool) -> None:
    exact, fast = exact_and(library_model, "bf16")
    assert {p.dtype for p in fast.parameters()} == {torch.bfloat16}
    ids = random_ids(2, 12)
    with torch.no_grad():
        expected, output = exact(ids).logits, fast(ids, use_cache=True)
    assert output.logits.dtype == torch.bfloat16
    assert (output.logits.float() - expected).abs().max() < 0.05 * expected.abs().max()  # rounding, not another model
    # the library's attention keeps its KV cache (and scores, softmax, weighted sum) in fp32; Hugging Face's casts all
    assert output_cache(output).layers[0].keys.dtype == (torch.float32 if library_model else torch.bfloat16)
    out = fast.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 17)


def test_bf16_off_the_cpu_keeps_the_kv_cache_in_bf16() -> None:
    """On a GPU the fused SDPA kernels take bf16 and a bf16 cache halves a step's memory traffic: the library's
    attention is not pinned to fp32 there (here a model on the meta device stands for one that is not on a CPU)."""
    from gatt.model.attention import MaskedMultiHeadAttention
    from gatt.model.modeling import GattForCausalLM

    cpu = for_inference(GattForCausalLM.from_llama(tiny_llama()), "bf16")
    elsewhere = GattForCausalLM.from_llama(tiny_llama()).to("meta")
    elsewhere = for_inference(elsewhere, "bf16")
    dtypes = {
        name: {m.attention_dtype for m in model.modules() if isinstance(m, MaskedMultiHeadAttention)}
        for name, model in (("cpu", cpu), ("elsewhere", elsewhere))
    }
    assert dtypes == {"cpu": {torch.float32}, "elsewhere": {None}}


def test_unknown_modes_and_gpus_are_refused() -> None:
    with pytest.raises(ValueError, match="numerics 'fp8' is not one of exact, bf16, int8"):
        for_inference(tiny_llama(), "fp8")
    model = tiny_llama()
    model.to("meta")
    with pytest.raises(ValueError, match="int8 runs on CPU only"):
        for_inference(model, "int8")


def test_the_teacher_samples_in_int8(tmp_path) -> None:
    from data_gen.__main__ import parse
    from data_gen.teacher import ModelTeacher, TurnRequest
    from data_gen.user_turns import UserTurn
    from gatt import GattConfig, GattForCausalLM
    from gatt.model.tokenizer import train_tokenizer
    from tests.test_generation import TEXTS

    tokenizer = train_tokenizer(TEXTS, vocab_size=300)
    torch.manual_seed(0)
    GattForCausalLM(
        GattConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    ).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    teacher = ModelTeacher(tmp_path, max_new_tokens=4, device="cpu", numerics="int8")
    assert not any(type(m) is nn.Linear for m in teacher.model.modules())
    [candidates] = teacher.sample(
        [TurnRequest([{"role": "user", "content": TEXTS[0]}], UserTurn(TEXTS[0], None), ())], k=2
    )
    assert len(candidates) == 2
    _, (_, _, teacher_config) = parse(
        ["gatt", "--teacher", str(tmp_path), "--teacher-numerics", "int8", "--num-dialogues", "1", "--out", "x"]
    )
    assert teacher_config.teacher_numerics == "int8"


@pytest.mark.parametrize(("bf16_gflops", "fast"), [(166.0, False), (900.0, True)])
def test_auto_measures_bf16_even_where_the_cpu_claims_bf16_instructions(monkeypatch, bf16_gflops, fast):
    """A virtual Xeon reporting AVX512-BF16 multiplied bf16 at half fp32's speed: the flags alone must not pick bf16."""
    import gatt.io.machine
    import gatt.model.numerics

    speeds = {torch.float32: 320.0, torch.bfloat16: bf16_gflops}
    monkeypatch.setattr(gatt.model.numerics, "bf16_is_native", lambda: True)
    monkeypatch.setattr(gatt.io.machine, "matmul_gflops", lambda dtype, **_: speeds[dtype])
    gatt.model.numerics._cpu_bf16_is_faster.cache_clear()
    try:
        assert gatt.model.numerics.bf16_is_fast("cpu") is fast
        assert gatt.model.numerics.resolve_auto("auto", "cpu", "bf16", "exact", "numerics") == (
            "bf16" if fast else "exact"
        )
    finally:
        gatt.model.numerics._cpu_bf16_is_faster.cache_clear()
