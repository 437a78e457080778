"""The compiled engine over a file's own blocks (format "blocks"): the block kernel as an operator
(fast/kernels/block_op.py) inside AOTInductor programs.

Reference: the eager native model, whose layers call the same C function through ctypes (checked
against the file's exact weights in test_file_blocks.py). Tolerance: inductor reorders the float32
sums around the kernel (the compiled float32 engine agrees to 1e-4, test_compiled_decode.py), and a
change in the last bit of x can move the kernel's 16-bit rounding of it by one step, so the two
agree only as each agrees with the exact model: within 1e-3 of the largest logit, the bound of
test_file_blocks.py. Greedy tokens must be equal.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model

from llamablock.fast.compiled.aoti_engine import AOTIEngine
from llamablock.fast.kernels import block_op, ggml_kernel, prompt_attention
from llamablock.fast.plan import load_gguf_native, load_in_format, own_format
from llamablock.io.source import open_source
from llamablock.runtime.engine import EagerEngine
from llamablock.runtime.generate import generate

PROMPT = [5, 17, 3, 88, 42, 9, 61]


def _tiny(tmp_path, qtype="Q4_1", **kw):
    f = tmp_path / f"{qtype}.gguf"
    hf = tiny_hf_model("llama", n_heads=4, n_kv=2, hidden_size=64, intermediate_size=128, head_dim=16)
    write_tiny_gguf(f, hf, qtype=qtype, **kw)
    return f


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_the_operator_computes_what_the_ctypes_call_does(type_name):
    import gguf

    assert block_op.load(), block_op.why_not()
    w = torch.randn(48, 96).numpy()
    blocks = torch.from_numpy(gguf.quants.quantize(w, gguf.GGMLQuantizationType[type_name]).copy())
    x = torch.randn(2, 5, 96)
    got = torch.ops.llamablock.block_linear(x, blocks, ggml_kernel.TYPE_IDS[type_name])
    assert got.shape == (2, 5, 48)
    assert torch.equal(got.reshape(10, 48), ggml_kernel.matmul(type_name, blocks, x.reshape(10, 96)))


def _logits(engine, ids, steps):
    """The prefill's last logits and each greedy step's, through an engine's prefill/step."""
    engine.prepare(ids.shape[1] + steps + 1)
    out = [engine.prefill(ids)[0]]
    for i in range(steps):
        out.append(engine.step(out[-1].argmax()[None, None], ids.shape[1] + i)[0])
    return out


@pytest.mark.slow
def test_the_compiled_blocks_follow_the_eager_blocks(tmp_path):
    model, _ = load_gguf_native(_tiny(tmp_path), engine="compiled")  # its blocks call the operator
    engine = AOTIEngine(model, "blocks", autotune=False)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        # padded; and one the prefill's attention takes in chunks (fast/kernels/prompt_attention.py: the operator's)
        for ids in (torch.tensor([PROMPT]), torch.randint(0, 97, (1, prompt_attention.FROM + 44), generator=gen)):
            for g, r in zip(_logits(engine, ids, 6), _logits(EagerEngine(model), ids, 6), strict=True):
                torch.testing.assert_close(g, r, atol=1e-3 * r.abs().max().item(), rtol=0)
    assert engine.running == {"step": "inductor's default kernels", "prefill": "inductor's default kernels"}
    assert generate(engine, PROMPT, 12).tokens == generate(EagerEngine(model), PROMPT, 12).tokens


FRESH = r"""
import sys, torch
from llamablock.fast.compiled import aoti_step, builds
from llamablock.fast.kernels import prompt_attention
from llamablock.fast.compiled.aoti_engine import AOTIEngine
from llamablock.fast.machine import this_machine
from llamablock.fast.plan import load_gguf_native
from llamablock.runtime.generate import generate
model, _ = load_gguf_native(sys.argv[1], engine="compiled")
aoti_step.weights_digest = None  # named by the file's identity: the weights are never hashed
weights_id = builds.weights_identity(sys.argv[1], "blocks", this_machine().grouped)
engine = AOTIEngine(model, "blocks", autotune=False, weights_id=weights_id)
tokens = generate(engine, [5, 17, 3, 88, 42, 9, 61], 8).tokens
print(engine.compile_seconds > 0, ",".join(map(str, tokens)))
"""


@pytest.mark.slow
def test_a_fresh_process_registers_the_operator_before_loading_the_programs(tmp_path):
    """The programs call llamablock::block_linear by name: a process that only loads them (the second)
    must have registered it first, and gets the same tokens."""
    f = _tiny(tmp_path)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", FRESH, str(f)], env=env, capture_output=True, text=True)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    (compiled, first), (again, second) = (r.stdout.split()[-2:] for r in runs)
    assert (compiled, again) == ("True", "False") and first == second


def test_a_file_s_identity_names_its_packages_without_hashing_the_weights(tmp_path, monkeypatch):
    """A compiled start from a file names its packages by the file's identity and the blocks' layout;
    a file written again (a new modification time) or a folder (whose time does not follow its
    files) is named by the weights' hash instead."""
    from llamablock.fast.compiled import aoti_step, builds
    from llamablock.fast.plan import build, decide

    f = _tiny(tmp_path)
    source = open_source(f)
    plan = decide(source, "blocks", "compiled")
    engine = build(source, plan).engine
    assert engine.weights_id == builds.weights_identity(f, "blocks", plan.grouped)
    monkeypatch.setattr(aoti_step, "weights_digest", lambda static: pytest.fail("the weights were hashed"))
    assert aoti_step.weights_name(engine.static, engine.weights_id) == aoti_step.weights_name(None, engine.weights_id)
    before = builds.weights_identity(f, "blocks")
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert builds.weights_identity(f, "blocks") != before
    assert builds.weights_identity(f, "q8") != builds.weights_identity(f, "blocks")
    assert builds.weights_identity(tmp_path, "blocks") is None
    monkeypatch.setattr(aoti_step, "weights_digest", lambda static: "hashed")
    assert aoti_step.weights_name(engine.static) == "hashed"


def test_auto_compiles_the_files_own_blocks_where_it_can(tmp_path, monkeypatch):
    assert own_format(open_source(_tiny(tmp_path))) == "blocks"
    import gguf

    (tmp_path / "mixed").mkdir()
    q5 = gguf.quants.quantize(torch.randn(64, 128).numpy(), gguf.GGMLQuantizationType.Q5_1)  # a type not kept
    mixed = {"blk.0.ffn_down.weight": (q5, "Q5_1")}
    assert own_format(open_source(_tiny(tmp_path / "mixed", raw_blocks=mixed))) == "q4"  # the packed majority
    from llamablock.fast import machine

    no_kernel = machine.this_machine().without_kernel("turned off by the test")
    assert own_format(open_source(_tiny(tmp_path)), no_kernel) == "q4"  # no kernel: the packed format, as before


def test_dtype_blocks_is_refused_where_it_cannot_run(tmp_path):
    d = tmp_path / "hf"
    tiny_hf_model("llama", n_heads=4, n_kv=2).save_pretrained(d)
    with pytest.raises(ValueError, match="--dtype blocks runs a GGUF .* is not a GGUF file; use --dtype auto"):
        load_in_format(open_source(d, tokenizer=False), "blocks")
    with pytest.raises(ValueError, match="its layer matrices are Q5_1"):
        load_in_format(open_source(_tiny(tmp_path, "Q5_1"), tokenizer=False), "blocks")
