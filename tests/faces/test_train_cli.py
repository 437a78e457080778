"""`llamablock train` from the command line: a short run, and clear errors for bad input."""

from llamablock.cli import main
from llamablock.commands.train import parse_overrides

TINY = ["--set", "d_model=32", "--set", "n_layers=1", "--set", "n_heads=4", "--set", "d_ff=64",
        "--set", "max_seq_len=16"]


def _err(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1  # one line, no traceback
    return err


def test_short_run_and_resume(tmp_path, capsys):
    out = str(tmp_path / "run")
    argv = ["train", "--arch", "2024", *TINY, "--steps", "4", "--batch-size", "4", "--context", "16",
            "--eval-every", "2", "--eval-windows", "4", "--warmup", "1", "--no-progress", "--out", out]
    assert main(argv) == 0
    assert "validation loss" in capsys.readouterr().out
    assert main(["train", "--resume", "--out", out, "--steps", "6", "--no-progress"]) == 0
    assert "to step 6" in capsys.readouterr().out


def test_unknown_preset(capsys):
    assert "unknown preset 'gpt-5'" in _err(capsys, ["train", "--preset", "gpt-5", "--steps", "1"])


def test_set_unknown_field(capsys):
    err = _err(capsys, ["train", "--set", "n_experts=8", "--steps", "1"])
    assert "unknown field 'n_experts'" in err and "n_kv_heads" in err


def test_set_wrong_type(capsys):
    assert "n_kv_heads expects int or None" in _err(capsys, ["train", "--set", "n_kv_heads=two", "--steps", "1"])
    assert "expects float" in _err(capsys, ["train", "--set", "rope_theta=big", "--steps", "1"])
    assert "expects bool" in _err(capsys, ["train", "--set", "qkv_bias=maybe", "--steps", "1"])


def test_set_invalid_value_is_reported_by_the_config(capsys):
    assert "ffn must be one of" in _err(capsys, ["train", "--set", "ffn=tanh", "--steps", "1"])


def test_overrides_are_typed():
    got = parse_overrides(["n_kv_heads=2", "ffn=gelu", "rope_theta=5e5", "tie_embeddings=false",
                           "head_dim=none", 'rope_scaling={"rope_type": "llama3", "factor": 2.0}'])
    assert got == {"n_kv_heads": 2, "ffn": "gelu", "rope_theta": 5e5, "tie_embeddings": False, "head_dim": None,
                   "rope_scaling": {"rope_type": "llama3", "factor": 2.0}}


def test_resume_without_checkpoint(tmp_path, capsys):
    assert "no checkpoint in" in _err(capsys, ["train", "--resume", "--out", str(tmp_path)])


def test_context_longer_than_the_split(capsys):
    # the validation split of tiny shakespeare is ~119k characters
    err = _err(capsys, ["train", "--arch", "2024", "--set", "max_seq_len=200000", "--context", "150000", "--steps", "1"])
    assert "too few for a context of 150000" in err
