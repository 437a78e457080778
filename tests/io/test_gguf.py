"""GGUF loading: the real SmolLM2 file against transformers, tiny files from gguf's own writer.

References: transformers loading the same GGUF (`from_pretrained(dir, gguf_file=...)`), and the
`gguf` package's quantize/dequantize. Tolerances: SmolLM2 logits 1e-3 (the issue's bound, float32
on both sides); tiny float32 files 1e-4 (tests/components/test_hf_parity.py's bound).
"""

import gguf
import numpy as np
import pytest
import torch
from gguf_tiny import random_kquant_blocks, to_torch, write_tiny_gguf
from hf_reference import tiny_hf_model

import llamablock
from llamablock.io.gguf import dequantize, llamacpp_permute, load_gguf, open_gguf
from llamablock.io.resolve import resolve_model
from llamablock.rope import permute_qk

SMOL = resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def smol_pair():
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(SMOL.parent, gguf_file=SMOL.name, dtype=torch.float32).eval()
    return ref, llamablock.load_pretrained(None)


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smol_pair):
    ref, ours = smol_pair
    assert ours.cfg.n_layers == 30 and ours.cfg.n_kv_heads == 3 and ours.cfg.rope_theta == 100000.0
    ids = torch.randint(0, ours.cfg.vocab_size, (1, 64))
    with torch.no_grad():
        a, b = ours(ids), ref(ids).logits
    assert (a - b).abs().max().item() <= 1e-3


@pytest.mark.slow
def test_smollm2_greedy_ids_match_transformers(smol_pair):
    from llamablock.runtime.engine import EagerEngine
    from llamablock.runtime.generate import generate

    ref, ours = smol_pair
    prompt = torch.tensor([[504, 3575, 282, 4649, 314]])  # "The capital of France is" (SmolLM2 vocab)
    with torch.no_grad():
        want = ref.generate(prompt, max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=2)[0, 5:]
    got = generate(EagerEngine(ours), prompt[0].tolist(), max_new_tokens=32, eos_ids=[]).tokens
    assert got == want.tolist()


def test_default_and_named_model_resolve_to_the_embedded_file():
    assert resolve_model(None) == resolve_model("smollm2-135m-instruct") == SMOL
    assert SMOL.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and SMOL.is_file()


def test_smollm2_dequantizes_bit_for_bit_as_gguf_does():
    # The loader runs gguf's block kernels on chunks of rows (and reads through a plain view of
    # the memory map); every tensor of the real file, the 49,152-row embedding in 28 chunks
    # included, must equal gguf.quants.dequantize's float32 output exactly.
    reader = open_gguf(SMOL)
    assert {t.tensor_type.name for t in reader.tensors} == {"Q4_1", "Q8_0", "F32"}
    for t in reader.tensors:
        ours = dequantize(t)
        ref = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(ours.shape)
        assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), t.name


def test_llamacpp_permutation_round_trips():
    w = torch.randn(3 * 8, 5)  # 3 heads of width 8
    p = llamacpp_permute(w, 3)
    assert not torch.equal(p, w)
    assert torch.equal(permute_qk(p, 3, 8, 8, to="half"), w)
    assert torch.equal(permute_qk(w, 3, 8, 8, to="interleaved"), p)


def _tiny(**kw):
    return tiny_hf_model("llama", n_heads=4, n_kv=2, **kw)


@pytest.mark.parametrize("arch,family", [("llama", "llama"), ("qwen2", "qwen2")])
def test_tiny_float32_gguf_matches_transformers_model(tmp_path, arch, family):
    hf = tiny_hf_model(family, n_heads=4, n_kv=2)
    f = tmp_path / "tiny.gguf"
    write_tiny_gguf(f, hf, arch=arch)
    ids = torch.randint(0, 97, (2, 24))
    with torch.no_grad():
        ref = hf(ids).logits
        for layout in ("half", "interleaved"):  # the two layouts compute the same function
            got = load_gguf(f, rope_layout=layout)(ids)
            assert (got - ref).abs().max().item() <= 1e-4, layout


# Bound on |dequantized - original| per type, as a fraction of the tensor's max |w|: half a
# quantization step, with the step from the formats (ggml-quants.c): Q8_0 amax/127; Q4_0
# amax/8; Q5_0 amax/16; Q4_1 range/15; Q5_1 range/31 (range <= 2 amax); F16, BF16 relative
# rounding 2^-11, 2^-8. We allow a full step (clamping at the extreme code, fp16 scales).
STEP = {"F32": 0.0, "F16": 2**-10, "BF16": 2**-7, "Q8_0": 1 / 127, "Q4_0": 1 / 8, "Q5_0": 1 / 16,
        "Q4_1": 2 / 15, "Q5_1": 2 / 31}
BIG = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=1, head_dim=64)


@pytest.mark.parametrize("qtype", list(STEP))
def test_quantized_tiny_gguf_loads_within_quantization_error(tmp_path, qtype):
    hf = _tiny(**BIG)
    f = tmp_path / f"tiny-{qtype}.gguf"
    write_tiny_gguf(f, hf, qtype=qtype)
    ours = load_gguf(f)
    reader = open_gguf(f)
    assert {t.tensor_type.name for t in reader.tensors if len(t.shape) == 2} == {qtype}
    state = ours.state_dict()
    for name, p in hf.state_dict().items():
        if "layers" in name:
            i = name.split(".")[2]
            ours_name = {"self_attn.q_proj": "attn.wq", "self_attn.k_proj": "attn.wk", "self_attn.v_proj": "attn.wv",
                         "self_attn.o_proj": "attn.wo", "mlp.gate_proj": "ffn.w_gate", "mlp.up_proj": "ffn.w_up",
                         "mlp.down_proj": "ffn.w_down", "input_layernorm": "norm1",
                         "post_attention_layernorm": "norm2"}[".".join(name.split(".")[3:-1])]
            key = f"layers.{i}.{ours_name}.weight"
        else:
            key = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "final_norm.weight",
                   "lm_head.weight": "head.weight"}[name]
        err = (state[key] - p).abs().max().item()
        assert err <= STEP[qtype] * p.abs().max().item() + 1e-7, (key, err)


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_kquant_blocks_load_as_gguf_dequantizes_them(tmp_path, kind):
    # gguf 0.19 has no quantizer for K types (gguf.quants.quantize raises NotImplementedError),
    # so random blocks are written raw and the loaded weights must equal gguf's own dequantization,
    # un-permuted for q/k.
    with pytest.raises(NotImplementedError):
        gguf.quants.quantize(np.zeros((1, 256), np.float32), gguf.GGMLQuantizationType[kind])
    hf = _tiny(**BIG)
    raw = {g: (random_kquant_blocks(kind, r, c, seed=i), kind) for i, (g, r, c) in enumerate(
        [("blk.0.attn_q.weight", 256, 256), ("blk.0.attn_k.weight", 128, 256), ("blk.0.ffn_up.weight", 512, 256)])}
    f = tmp_path / f"tiny-{kind}.gguf"
    written = write_tiny_gguf(f, hf, raw_blocks=raw)
    state = load_gguf(f).state_dict()
    wq = permute_qk(to_torch(written["blk.0.attn_q.weight"]), 4, 64, 64, to="half")
    wk = permute_qk(to_torch(written["blk.0.attn_k.weight"]), 2, 64, 64, to="half")
    assert torch.equal(state["layers.0.attn.wq.weight"], wq)
    assert torch.equal(state["layers.0.attn.wk.weight"], wk)
    assert torch.equal(state["layers.0.ffn.w_up.weight"], to_torch(written["blk.0.ffn_up.weight"]))
    assert torch.isfinite(wq).all() and wq.abs().max() > 0


def test_bfloat16_dtype_is_applied(tmp_path):
    f = tmp_path / "t.gguf"
    write_tiny_gguf(f, _tiny())
    assert load_gguf(f, dtype=torch.bfloat16).embed.weight.dtype == torch.bfloat16


# Bad input ----------------------------------------------------------------------------------------
def test_not_a_gguf_file(tmp_path):
    f = tmp_path / "x.gguf"
    f.write_bytes(b"PK\x03\x04 this is a zip")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        llamablock.load_pretrained(f)


def test_truncated_gguf(tmp_path):
    f = tmp_path / "t.gguf"
    write_tiny_gguf(f, _tiny())
    data = f.read_bytes()
    for cut in (len(data) - 100, 40):  # tensor data cut, header cut
        g = tmp_path / f"cut{cut}.gguf"
        g.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="truncated"):
            llamablock.load_pretrained(g)


def test_unsupported_architecture(tmp_path):
    f = tmp_path / "t.gguf"
    write_tiny_gguf(f, _tiny(), arch="mamba")
    with pytest.raises(ValueError, match="architecture 'mamba' is not supported"):
        llamablock.load_pretrained(f)


def test_unsupported_quant_type(tmp_path):
    f = tmp_path / "t.gguf"
    hf = _tiny(**BIG)
    blocks = np.zeros((256, 256 // 256 * 84), np.uint8)  # Q2_K: 84 bytes per 256 values
    write_tiny_gguf(f, hf, raw_blocks={"blk.0.attn_q.weight": (blocks, "Q2_K")})
    with pytest.raises(ValueError, match="quantization type Q2_K, which llamablock does not load"):
        llamablock.load_pretrained(f)


def test_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found|neither"):
        llamablock.load_pretrained(tmp_path / "nope.gguf")
    with pytest.raises(FileNotFoundError, match="known model name"):
        llamablock.load_pretrained("no-such-model")
