"""llamablock: the 2017 Transformer block and the 2024 LLaMA block, exact and side by side.

The module's own files sit at the package root, one idea each, in the module's order: config,
presets and families (the descendants' records), rope (15.1), rope_scaling and alibi (15.2),
positions, norm (15.3), ffn (15.4), attention and kv_cache (15.5), blocks and model (15.6). Every other concern is a
folder that imports only from the layers beneath it (tests/test_layers.py checks it): util, io,
runtime, fast and training, diagnostics, studies, lab, web, commands.

Shapes, in every shape comment of the package:
    b  batch                   t  new tokens             s  keys (cached + new)
    L  static cache slots      D  model width            V  vocabulary
    h  query heads             n_kv  key-value heads     g  = h / n_kv, queries per KV head
    hd head width              r  rotary width (hd x partial_rotary_factor)
    d_ff  feed-forward width;  matmuls in fast/quant: x (m, k) @ W^T, W (n, k)

The way in for running a checkpoint is two calls, as mlx-lm's `load` and `generate`:

    engine, tok = llamablock.load("model.gguf")        # resolve, plan, read the weights once
    print(llamablock.generate(engine, tok, "The capital of France is", 20).text)

The public names below are imported on first use (PEP 562), so that `import llamablock.cli`
(and `llamablock --help`) does not import torch.
"""

from __future__ import annotations

import importlib

__all__ = ["ModelConfig", "Decoder", "KVCache", "PRESETS", "preset", "config_from_hf", "config_to_hf",
           "load", "generate", "load_pretrained", "load_model_and_tokenizer", "save_pretrained"]
_LAZY = {"ModelConfig": "llamablock.config", "Decoder": "llamablock.model", "KVCache": "llamablock.kv_cache",
         "PRESETS": "llamablock.presets", "preset": "llamablock.presets",
         "config_from_hf": "llamablock.io.hf_config", "config_to_hf": "llamablock.io.hf_config"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'llamablock' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load(model=None, fmt: str = "auto", engine: str = "auto", device: str = "auto"):
    """(engine, tokenizer) for a model name, GGUF file or checkpoint directory (None: the default
    model), run as the command line runs it: one plan (fast/plan.py; `fmt` and `engine` as
    `--dtype` and `--engine` take them, `device` as `--device`), the weights read once. A compiled
    engine is made ready for its recorded build's length (or 512 tokens, `llamablock compile`'s
    default). The engine's `plan` says what it does (`engine.plan.describe()`)."""
    from llamablock.fast.plan import build, decide, prepare
    from llamablock.io.source import open_source
    from llamablock.util.devices import resolve_device

    source = open_source(model)
    plan = decide(source, fmt, engine, resolve_device(device))
    running = build(source, plan).engine
    if plan.engine == "compiled":
        prepare(running, source, plan.built or min(512, source.cfg.max_seq_len))
    running.plan = plan
    return running, source.tokenizer


def generate(engine, tokenizer, prompt: str, max_new_tokens: int = 64, sampling=None, **options):
    """Continue `prompt` (text) on an engine from `load`: the Generation (its `text`, `tokens`, rates).
    `sampling` a runtime.sampling.Sampling (None: greedy); `options` as runtime.generate.generate
    takes them (seed, stop_strings, on_text)."""
    from llamablock.runtime.generate import generate as run

    return run(engine, tokenizer.encode(prompt), max_new_tokens, sampling, eos_ids=tokenizer.eos_ids,
               tokenizer=tokenizer, **options)


def load_pretrained(path=None, dtype=None):
    """A model from a transformers directory (config.json + safetensors) or a GGUF file."""
    from llamablock.io.loading import load_pretrained as _load

    return _load(path, dtype=dtype)


def load_model_and_tokenizer(path=None, dtype=None):
    """(Decoder, Tokenizer) for a model name, GGUF file or checkpoint directory (None: the default model)."""
    from llamablock.io.loading import load_model_and_tokenizer as _load

    return _load(path, dtype=dtype)


def save_pretrained(model, path):
    """Write config.json and model.safetensors in transformers' format."""
    from llamablock.io.hf_checkpoint import save_pretrained as _save

    return _save(model, path)
