"""The block's descendants against transformers: Qwen3, Gemma 2, Gemma 3, Phi-3 (float32, CPU).

Each tiny random model is saved by transformers and loaded by llamablock. Tolerance: max |logit
difference| <= 1e-4, issue 19's bound. The cases cover what each family adds: q/k norms, explicit
head widths, MQA and GQA, tied and untied embeddings, positions offset into the thousands,
windows shorter than the text, Gemma 3's mixed layers with two RoPEs, soft-capping that bites
(caps small enough that tanh is far from linear on these weights), and Phi-3's LongRoPE past its
original length. Cached decoding (the ring-buffer cache included) must equal the full forward.
"""

import pytest
import torch
from hf_reference import max_logit_gap_at_offsets, tiny_hf_model

import llamablock
from llamablock.io.hf_config import config_from_hf, config_to_hf

SLIDING, FULL = "sliding_attention", "full_attention"
LONG = dict(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.3, 2.0, 4.0],
                             "long_factor": [1.5, 3.0, 7.0, 16.0]},
            original_max_position_embeddings=16, max_position_embeddings=4096)
CASES = {
    "qwen3-gqa": ("qwen3", dict(n_heads=4, n_kv=2)),
    "qwen3-mqa-tied-bias": ("qwen3", dict(n_heads=4, n_kv=1, tied=True, attention_bias=True)),
    "qwen3-window-upper-layers": ("qwen3", dict(n_heads=4, n_kv=2, num_hidden_layers=3, use_sliding_window=True,
                                                sliding_window=6, max_window_layers=1)),
    "qwen2-window-upper-layers": ("qwen2", dict(n_heads=4, n_kv=2, num_hidden_layers=3, use_sliding_window=True,
                                                sliding_window=6, max_window_layers=2)),
    "gemma2-capped": ("gemma2", dict(n_heads=4, n_kv=2, sliding_window=6, query_pre_attn_scalar=12,
                                     attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),
    "gemma2-mqa-untied": ("gemma2", dict(n_heads=4, n_kv=1, tied=False, sliding_window=6)),
    "gemma3-mixed-two-ropes": ("gemma3_text", dict(
        n_heads=4, n_kv=2, num_hidden_layers=4, sliding_window=6, query_pre_attn_scalar=12,
        layer_types=[SLIDING, SLIDING, FULL, SLIDING],
        rope_parameters={FULL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                         SLIDING: {"rope_type": "default", "rope_theta": 10_000.0}})),
    "gemma3-one-scaled-rope": ("gemma3_text", dict(  # what a model with local_rope_theta None saves as
        n_heads=4, n_kv=2, num_hidden_layers=2, sliding_window=6, layer_types=[SLIDING, FULL],
        rope_parameters={k: {"rope_type": "linear", "factor": 4.0, "rope_theta": 10_000.0} for k in (FULL, SLIDING)})),
    "gemma3-final-cap": ("gemma3_text", dict(n_heads=4, n_kv=4, sliding_window=6, final_logit_softcapping=3.0)),
    "phi3-longrope": ("phi3", dict(n_heads=4, n_kv=2, **LONG)),
    "phi3-window-mha": ("phi3", dict(n_heads=4, n_kv=4, sliding_window=6)),
}


def _load_pair(tmp_path, name):
    family, kw = CASES[name]
    hf = tiny_hf_model(family, **kw)
    hf.save_pretrained(tmp_path)
    return hf, llamablock.load_pretrained(tmp_path)


@pytest.mark.parametrize("name", CASES)
def test_logits_match_transformers(tmp_path, name):
    hf, ours = _load_pair(tmp_path, name)
    assert ours.cfg.family == CASES[name][0]
    # 24 tokens: longer than every window here, past Phi-3's original 16. Phi-3 picks its factors by
    # the largest position (transformers' longrope), so the row offset 3000 in runs both on the long ones.
    assert max_logit_gap_at_offsets(hf, ours) <= 1e-4


def test_phi3_within_its_original_length_uses_the_short_factors(tmp_path):
    hf, ours = _load_pair(tmp_path, "phi3-longrope")
    ids = torch.randint(0, 97, (1, 12))  # positions 0..11 < 16: short factors on both sides
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("name", CASES)
def test_cached_decode_equals_full_forward(tmp_path, name):
    """Far past every window (40 tokens, windows of 6): the ring wraps several times. Each step is
    compared with the full forward of its own prefix. The prefill (20) is past Phi-3's original
    length (16): a cache crossing it mid-generation keeps values computed under the short factors
    in the layers above the first (rope_scaling.rotates_cached_keys), as any cache does."""
    _, ours = _load_pair(tmp_path, name)
    ids = torch.randint(0, 97, (2, 40))
    with torch.no_grad():
        cache = llamablock.KVCache(ours.cfg, batch_size=2, max_len=64)
        prefill = ours(ids[:, :20], cache=cache)  # longer than the window, then one token at a time
        assert (prefill - ours(ids[:, :20])).abs().max().item() <= 1e-5
        for i in range(20, 40):
            step = ours(ids[:, i: i + 1], cache=cache)[:, -1]
            assert (step - ours(ids[:, : i + 1])[:, -1]).abs().max().item() <= 1e-5, i


@pytest.mark.parametrize("name", ["qwen3-gqa", "qwen2-window-upper-layers", "gemma2-capped", "gemma3-mixed-two-ropes",
                                  "gemma3-one-scaled-rope", "phi3-longrope"])
def test_our_save_loads_in_transformers(tmp_path, name):
    import transformers

    hf, ours = _load_pair(tmp_path / "a", name)
    llamablock.save_pretrained(ours, tmp_path / "b")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "b", attn_implementation="eager").eval()
    ids = torch.randint(0, 97, (1, 20))
    with torch.no_grad():
        assert (back(ids).logits - hf(ids).logits).abs().max().item() == 0.0


@pytest.mark.parametrize("change,words", [
    (dict(qk_norm=True, norm="layernorm"), "qk_norm and sandwich_norm are RMSNorm designs"),
    (dict(sandwich_norm=True, norm_placement="post"), "set norm_placement='pre'"),
    (dict(layer_types=["sliding", "full"]), "sliding_window is not set"),
    (dict(layer_types=["full"], sliding_window=4), "for each of the 2 layers"),
    (dict(layer_types=["local", "full"], sliding_window=4), "layer_types holds 'local'"),
    (dict(local_rope_theta=1e4), "this model has none"),
    (dict(attn_softcap=float("nan")), "attn_softcap must be a positive finite number"),
    (dict(query_pre_attn_scalar=0), "query_pre_attn_scalar must be a positive finite number"),
    (dict(qk_norm=True, position="alibi"), "belong to RoPE models"),
])
def test_incompatible_options_are_refused_by_name(change, words):
    base = dict(vocab_size=50, d_model=16, n_layers=2, n_heads=2)
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        llamablock.ModelConfig(**{**base, **change})


@pytest.mark.parametrize("change,words", [
    (dict(model_type="gemma3_text", rope_parameters={"full_attention": {"rope_type": "default"},
                                                     "sliding_attention": {"rope_type": "linear", "factor": 2.0}}),
     "sliding layers with rope_type 'linear'"),
    (dict(model_type="gemma2", layer_types=["sliding_attention"]), "layer_types must list"),
    (dict(model_type="qwen3", use_sliding_window="yes"), "use_sliding_window must be true or false"),
    (dict(model_type="gemma2", attn_logit_softcapping="50"), "attn_logit_softcapping must be a finite number"),
])
def test_bad_descendant_configs_name_the_field(change, words):
    hf = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24)
    with pytest.raises(ValueError, match=words):
        config_from_hf({**hf, **change})


def test_the_compiled_engines_refuse_the_descendants_by_name():
    from llamablock.fast.compiled.static_decode import unsupported_reason

    cfg = config_from_hf(dict(
        model_type="gemma2", vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=24))
    reason = unsupported_reason(cfg)
    assert "sandwich norms" in reason and "soft-capping" in reason and "mixed local and global layers" in reason


def test_the_text_model_of_a_multimodal_gemma3_checkpoint(tmp_path):
    """Gemma3ForConditionalGeneration saves its language model under `language_model.` and ties the
    head by the outer config's flag; the vision tower and projector are not loaded."""
    import transformers
    from hf_reference import redraw, tiny_hf_config

    text = tiny_hf_config("gemma3_text", sliding_window=6).to_dict()
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                    image_token_index=96, boi_token_index=95, eoi_token_index=94)
    torch.manual_seed(0)
    hf = redraw(transformers.Gemma3ForConditionalGeneration(cfg), "gemma3").eval()
    hf.save_pretrained(tmp_path)
    ours = llamablock.load_pretrained(tmp_path)
    assert ours.cfg.family == "gemma3_text" and ours.cfg.tie_embeddings
    ids = torch.randint(0, 90, (1, 20))
    with torch.no_grad():
        assert (ours(ids) - hf(input_ids=ids).logits).abs().max().item() <= 1e-4


def test_gemma3_with_one_scaled_rope_round_trips(tmp_path):
    """A Gemma 3 whose sliding layers share the full layers' scaled RoPE (local_rope_theta None) is
    written with the scaled RoPE for both layer types, not unscaled sliding layers, and reads back
    as the same config (tests above compare the logits with transformers)."""
    _, ours = _load_pair(tmp_path, "gemma3-one-scaled-rope")
    assert ours.cfg.local_rope_theta is None and ours.cfg.rope_scaling["rope_type"] == "linear"
    hf = config_to_hf(ours.cfg)
    assert hf["rope_parameters"]["sliding_attention"] == hf["rope_parameters"]["full_attention"]
    assert config_from_hf(hf).replace(extra={}) == ours.cfg.replace(extra={})
