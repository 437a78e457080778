"""Norms, feed-forward layers and ALiBi against transformers' modules and closed forms."""

import math

import pytest
import torch
from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from llamablock.alibi import alibi_slopes
from llamablock.ffn import MLP, GatedFFN, gated_ffn_width, swish
from llamablock.norm import RMSNorm, make_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_equals_transformers_bit_for_bit(dtype):
    ours, ref = RMSNorm(64, eps=1e-6), LlamaRMSNorm(64, eps=1e-6)
    w = 1 + 0.1 * torch.randn(64)
    ours.weight.data.copy_(w)
    ref.weight.data.copy_(w)
    ours, ref = ours.to(dtype), ref.to(dtype)
    x = (3 * torch.randn(4, 7, 64)).to(dtype)
    out = ours(x)
    assert out.dtype == dtype  # the output keeps the input's dtype
    assert torch.equal(out, ref(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_rmsnorm_equals_transformers(dtype):
    ours, ref = RMSNorm(64, eps=1e-6, offset=1.0), GemmaRMSNorm(64, eps=1e-6)
    w = 0.1 * torch.randn(64)
    ours.weight.data.copy_(w)
    ref.weight.data.copy_(w)
    x = torch.randn(4, 64).to(dtype)
    assert torch.equal(ours.to(dtype)(x), ref.to(dtype)(x))


def test_rmsnorm_closed_form_and_parameter_saving():
    x = torch.tensor([[3.0, 4.0]])
    # RMS = sqrt((9 + 16) / 2) = sqrt(12.5)
    assert torch.allclose(RMSNorm(2, eps=0.0)(x), x / math.sqrt(12.5))
    rms, ln = make_norm("rmsnorm", 512, 1e-5), make_norm("layernorm", 512, 1e-5)
    assert sum(p.numel() for p in ln.parameters()) - sum(p.numel() for p in rms.parameters()) == 512


def _copy_linear(dst, src):
    dst.weight.data.copy_(src.weight.data)


@pytest.mark.parametrize("act,config,hf_act,mlp", [("swiglu", "LlamaConfig", "silu", LlamaMLP),
                                                    ("geglu", "GemmaConfig", "gelu_pytorch_tanh", GemmaMLP)])
def test_gated_ffn_equals_transformers_mlp(act, config, hf_act, mlp):
    """SwiGLU is LlamaMLP and GeGLU is GemmaMLP, bit for bit, with the same weights."""
    import transformers

    cfg = getattr(transformers, config)(hidden_size=32, intermediate_size=48, hidden_act=hf_act)
    ref, ours = mlp(cfg), GatedFFN(32, 48, act)
    for a, b in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("w_down", "down_proj")):
        _copy_linear(getattr(ours, a), getattr(ref, b))
    x = torch.randn(3, 5, 32)
    assert torch.equal(ours(x), ref(x))


def test_swish_values_from_the_module():
    # Section 15.4: Swish(2) ~ 1.76, Swish(-2) ~ -0.24; closed form z / (1 + e^-z).
    assert swish(torch.tensor(2.0)).item() == pytest.approx(2 / (1 + math.exp(-2)), rel=1e-6)
    assert round(swish(torch.tensor(2.0)).item(), 2) == 1.76
    assert round(swish(torch.tensor(-2.0)).item(), 2) == -0.24


def test_gated_width_and_equal_parameters():
    assert gated_ffn_width(4096) == 11008  # LLaMA 7B's d_ff (module 15.4)
    d = 96  # 8/3 d is an integer here, so equality is exact: 3 * d * 8d/3 = 2 * d * 4d = 8 d^2
    gated, plain = GatedFFN(d, 8 * d // 3, bias=False), MLP(d, 4 * d, bias=False)
    assert sum(p.numel() for p in gated.parameters()) == sum(p.numel() for p in plain.parameters()) == 8 * d * d


def test_alibi_slopes_closed_forms():
    # Press et al.: 8 heads -> 1/2, 1/4, ..., 1/256.
    assert alibi_slopes(8).tolist() == [2.0 ** -(h + 1) for h in range(8)]
    # 12 heads: the 8-head slopes, then every other slope of 16 heads (2^-0.5, 2^-1.5, ...).
    expected = [2.0 ** -(h + 1) for h in range(8)] + [2.0 ** -(0.5 + k) for k in range(4)]
    assert torch.allclose(alibi_slopes(12), torch.tensor(expected))
