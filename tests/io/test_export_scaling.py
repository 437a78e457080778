"""`llamablock export RUN OUT --rope-scaling ...`: the scaling is written where other runtimes read it.

A tiny run trained to 16 positions (tests/tiny_run.py) is exported with each method. The
reference is the model `generate` runs with the same flags (io/scaling_flags.scaled_source on
the run, the checkpoint's weights), over 60 tokens, most of them past the trained context; the
export is read back by transformers (config.json) and by llamablock's GGUF loader, and the logits
must agree within 1e-4 in float32. The GGUF file's keys are read with the `gguf` package and
compared with llama.cpp's names (`gguf.Keys.Rope`) and the values asked for.
"""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from tiny_run import make_run, refused

from llamablock import cli
from llamablock.io.loading import load_model_and_tokenizer
from llamablock.io.resolve import read_state, resolve_model
from llamablock.io.scaling_flags import add_scaling_arguments, scaled_source
from llamablock.io.source import open_source
from llamablock.model import Decoder
from llamablock.rope_scaling import ntk_base

N = 60  # tokens: positions 16..59 are past the trained context


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny run whose newest checkpoint holds random weights of a larger spread than two steps of
    training leave, so that positions past the context move the logits well above the tolerance."""
    from llamablock.training.checkpoint import save_checkpoint

    out = make_run(tmp_path_factory.mktemp("scaled") / "run", steps=2)
    model, _ = load_model_and_tokenizer(out)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3) if p.dim() > 1 else p.fill_(1.0)
    state = {k: v for k, v in read_state(resolve_model(out)).items() if k not in ("step", "optimizer", "sha256")}
    save_checkpoint(out, 3, model, torch.optim.AdamW(model.parameters()), state)
    return out


def _flags(argv):
    p = argparse.ArgumentParser()
    add_scaling_arguments(p)
    return p.parse_args(argv)


def _ids(model) -> torch.Tensor:
    torch.manual_seed(3)
    return torch.randint(0, model.cfg.vocab_size, (1, N))


def _reference(run, argv) -> Decoder:
    """The model `generate --model RUN <argv>` runs: the run's weights, the flags' config."""
    source = scaled_source(open_source(run), _flags(argv))
    model, _ = load_model_and_tokenizer(run)
    ref = Decoder(source.cfg)
    ref.load_state_dict(model.state_dict())
    return ref.eval()


# (export flags, generate's flags for the same scaling, config.json's rope_scaling)
HF = {
    "linear": (["--rope-scaling", "linear", "--rope-scale", "4"], ["--ctx-size", "64", "--rope-scaling", "linear"],
               {"rope_type": "linear", "factor": 4.0}),
    "yarn": (["--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-beta-fast", "8", "--yarn-beta-slow", "0.5"],
             ["--ctx-size", "64", "--rope-scaling", "yarn", "--yarn-beta-fast", "8", "--yarn-beta-slow", "0.5"],
             {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 8.0,
              "beta_slow": 0.5}),
    "llama3": (["--ctx-size", "64", "--rope-scaling", "llama3"], ["--ctx-size", "64", "--rope-scaling", "llama3"],
               {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 16,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    "ntk": (["--rope-scaling", "ntk", "--rope-scale", "4"], ["--ctx-size", "64", "--rope-scaling", "ntk"], None),
}


@pytest.mark.parametrize("name", sorted(HF))
def test_hf_export_carries_the_scaling_to_transformers(run, tmp_path, name):
    transformers = pytest.importorskip("transformers")
    argv, same, scaling = HF[name]
    out = tmp_path / "hf"
    assert cli.main(["export", str(run), str(out), "--format", "hf", *argv]) == 0
    conf = json.loads((out / "config.json").read_text())
    assert conf["max_position_embeddings"] == 64
    assert conf.get("rope_scaling") == scaling
    theta = read_state(resolve_model(run))["model_config"]["rope_theta"]
    want_theta = ntk_base(theta, 4.0, conf["head_dim"]) if name == "ntk" else theta
    assert conf["rope_theta"] == pytest.approx(want_theta) and conf["rope_parameters"]["rope_theta"] == conf["rope_theta"]
    ref = _reference(run, same)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = _ids(ref)
    with torch.no_grad():
        want = ref(ids)[0]
        assert (hf(ids).logits[0] - want).abs().max().item() <= 1e-4
        plain, _ = load_model_and_tokenizer(run)  # the unscaled model differs past the context: a real check
        assert (plain(ids)[0, 16:] - want[16:]).abs().max().item() > 1e-2


GGUF = {
    "yarn": (["--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-beta-fast", "8", "--yarn-beta-slow", "0.5"],
             HF["yarn"][1], {"type": "yarn", "factor": 4.0, "original_context_length": 16, "yarn_beta_fast": 8.0,
                             "yarn_beta_slow": 0.5}),
    "linear": (HF["linear"][0], HF["linear"][1], {"type": "linear", "factor": 4.0}),
    "ntk": (HF["ntk"][0], HF["ntk"][1], {}),
}


def _gguf_fields(path) -> dict:
    import gguf

    def value(field):
        v = field.contents()
        return v

    return {name: value(f) for name, f in gguf.GGUFReader(str(path)).fields.items()}


@pytest.mark.parametrize("name", sorted(GGUF))
def test_gguf_export_has_llama_cpps_keys_and_the_same_logits(run, tmp_path, name):
    import gguf

    argv, same, keys = GGUF[name]
    f = tmp_path / "m.gguf"
    assert cli.main(["export", str(run), str(f), "--format", "gguf", *argv]) == 0
    meta = _gguf_fields(f)
    rope = {k[len("llama.rope.scaling."):]: v for k, v in meta.items() if k.startswith("llama.rope.scaling.")}
    assert rope == pytest.approx(keys) if keys else rope == {}
    for key in keys:  # the names llama.cpp reads (gguf-py's constants)
        const = {"type": gguf.Keys.Rope.SCALING_TYPE, "factor": gguf.Keys.Rope.SCALING_FACTOR,
                 "original_context_length": gguf.Keys.Rope.SCALING_ORIG_CTX_LEN,
                 "yarn_beta_fast": gguf.Keys.Rope.SCALING_YARN_BETA_FAST,
                 "yarn_beta_slow": gguf.Keys.Rope.SCALING_YARN_BETA_SLOW}[key]
        assert const.format(arch="llama") in meta
    assert meta[gguf.Keys.LLM.CONTEXT_LENGTH.format(arch="llama")] == 64
    ref = _reference(run, same)
    assert meta[gguf.Keys.Rope.FREQ_BASE.format(arch="llama")] == pytest.approx(
        ntk_base(ref.cfg.rope_theta, 4.0, ref.cfg.rotary_dim) if name == "ntk" else ref.cfg.rope_theta, rel=1e-6)
    loaded, _ = load_model_and_tokenizer(f)
    assert loaded.cfg.max_seq_len == 64
    ids = _ids(ref)
    with torch.no_grad():
        assert (loaded(ids)[0] - ref(ids)[0]).abs().max().item() <= 1e-4


def test_a_runs_own_scaling_is_kept_unless_a_flag_replaces_it(run, tmp_path):
    """A checkpoint whose model_config scales RoPE (state.json is not under the weights' checksums)."""
    pytest.importorskip("transformers")
    import shutil

    own = tmp_path / "own"
    shutil.copytree(run, own, ignore=shutil.ignore_patterns(".lock"))
    state_file = resolve_model(own) / "state.json"
    state = json.loads(state_file.read_text())
    state["model_config"].update(max_seq_len=32, rope_scaling={"rope_type": "linear", "factor": 2.0})
    state_file.write_text(json.dumps(state))
    assert cli.main(["export", str(own), str(tmp_path / "hf")]) == 0  # auto: transformers matches it
    conf = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert conf["rope_scaling"] == {"rope_type": "linear", "factor": 2.0} and conf["max_position_embeddings"] == 32
    assert cli.main(["export", str(own), str(tmp_path / "m.gguf"), "--format", "gguf"]) == 0
    meta = _gguf_fields(tmp_path / "m.gguf")
    assert meta["llama.rope.scaling.type"] == "linear" and meta["llama.rope.scaling.factor"] == 2.0
    assert cli.main(["export", str(own), str(tmp_path / "plain"), "--rope-scaling", "none"]) == 0
    assert "rope_scaling" not in json.loads((tmp_path / "plain" / "config.json").read_text())


@pytest.mark.parametrize("argv, message", [
    (["--rope-scaling", "yarn"], "needs --rope-scale S or --ctx-size N"),
    (["--ctx-size", "64"], "exceeds the model's trained context of 16 tokens"),
    (["--rope-scaling", "linear", "--rope-scale", "0.5"], "--rope-scale must be at least 1"),
    (["--yarn-beta-fast", "8"], "--yarn-beta-fast applies to --rope-scaling yarn"),
    (["--rope-scaling", "wide"], "is unknown"),
    (["--format", "gguf", "--rope-scaling", "yarn", "--rope-scale", "2", "--yarn-attn-factor", "2"],
     "YaRN attention factor of its own"),
    (["--format", "gguf", "--rope-scaling", "llama3", "--rope-scale", "2"], "RoPE scaling llama3 has no GGUF"),
    (["--format", "hf", "--rope-scaling", "dynamic", "--rope-scale", "2"], "RoPE scaling dynamic"),
])
def test_bad_export_scaling_flags_are_one_line(run, tmp_path, capsys, argv, message):
    out = tmp_path / ("m.gguf" if "gguf" in argv else "out")
    assert message in refused(capsys, ["export", str(run), str(out), *argv])
    assert not out.exists()


def test_a_2017_model_takes_no_rope_flag(tmp_path, capsys):
    from llamablock.presets import preset
    from llamablock.training.train import TrainConfig, train

    train(preset("gpt-2017-small", d_model=32, n_layers=1, n_heads=4, n_kv_heads=4, d_ff=64, max_seq_len=16),
          TrainConfig(steps=1, batch_size=2, context=16, warmup=0, eval_every=1, eval_windows=1), tmp_path / "r",
          progress=False)
    err = refused(capsys, ["export", str(tmp_path / "r"), str(tmp_path / "o"), "--rope-scaling", "linear",
                           "--rope-scale", "2"])
    assert "applies to a model with RoPE positions; this one has learned positions" in err
