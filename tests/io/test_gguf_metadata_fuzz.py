"""Any numeric metadata key of every family's GGUF file, given a value of the wrong type or range,
ends in a config or in a ValueError that names the key or the tensor it disagrees with: never
another exception, never a model sized by an unchecked number.

The files are the tiny ones the family tests write (gguf_tiny, gguf_families_tiny); hypothesis picks
the key among those the file holds and the value among strings, arrays, flags, negative and huge
integers, fractions and non-finite floats (what a careless or hostile writer could store).
"""

from __future__ import annotations

import os

import gguf
import pytest
from gguf_families_tiny import write_family_gguf
from gguf_tiny import write_tiny_gguf
from hf_reference import tiny_hf_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamablock.config import ModelConfig
from llamablock.io.gguf import config_from_gguf, open_gguf

T = gguf.GGUFValueType
LONG = dict(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.3, 2.0, 4.0],
                             "long_factor": [1.5, 3.0, 7.0, 16.0]},
            original_max_position_embeddings=16, max_position_embeddings=4096)
FAMILIES = {  # family -> (transformers family, keyword arguments, writer)
    "llama": ("llama", {}, lambda f, m: write_tiny_gguf(f, m)),
    "qwen2": ("qwen2", {}, lambda f, m: write_tiny_gguf(f, m, arch="qwen2")),
    "qwen3": ("qwen3", {}, lambda f, m: write_family_gguf(f, m, "qwen3")),
    "gemma": ("gemma", {"tied": True}, lambda f, m: write_family_gguf(f, m, "gemma")),  # the converter writes tied
    "gemma2": ("gemma2", {"sliding_window": 6, "tied": True}, lambda f, m: write_family_gguf(f, m, "gemma2")),
    "gemma3": ("gemma3_text", {"sliding_window": 6}, lambda f, m: write_family_gguf(f, m, "gemma3_text")),
    "phi3": ("phi3", LONG, lambda f, m: write_family_gguf(f, m, "phi3")),
}
MAX_EXAMPLES = int(os.environ.get("LLAMABLOCK_FUZZ_EXAMPLES", "25"))  # more for a longer hunt
NUMERIC = {T.UINT8, T.INT8, T.UINT16, T.INT16, T.UINT32, T.INT32, T.UINT64, T.INT64, T.FLOAT32, T.FLOAT64}

BAD_VALUES = st.one_of(
    st.text(max_size=8).map(lambda s: (s, T.STRING)),
    st.lists(st.floats(allow_nan=False, width=32), min_size=1, max_size=3).map(lambda v: (v, T.ARRAY)),
    st.booleans().map(lambda b: (b, T.BOOL)),
    st.integers(-(2**31), -1).map(lambda i: (i, T.INT32)),
    st.integers(0, 2**63 - 1).map(lambda i: (i, T.UINT64)),
    st.floats(allow_nan=True, allow_infinity=True, width=32).map(lambda x: (x, T.FLOAT32)),
)


def _write(path, family: str, meta: dict | None = None) -> None:
    hf_family, kw, write = FAMILIES[family]
    real = gguf.GGUFWriter.write_header_to_file

    def header(self, *args, **kwargs):  # the replacement goes in before the header counts the keys
        for key, (value, kind) in (meta or {}).items():
            self.kv_data[0][key] = gguf.GGUFValue(value, kind)
        real(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf.GGUFWriter, "write_header_to_file", header)
        write(path, tiny_hf_model(hf_family, n_heads=4, n_kv=2, **kw))


@pytest.fixture(scope="module")
def numeric_keys(tmp_path_factory):
    """family -> the numeric metadata keys its tiny file holds (the architecture's and the rope's)."""
    out = {}
    for family in FAMILIES:
        f = tmp_path_factory.mktemp(family) / "base.gguf"
        _write(f, family)
        fields = open_gguf(f).fields
        out[family] = sorted(k for k, v in fields.items() if v.types and v.types[0] in NUMERIC
                             and not k.startswith(("general.", "tokenizer.")))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_wrong_metadata_is_a_config_or_a_named_refusal(tmp_path_factory, numeric_keys, family):
    keys = numeric_keys[family]
    assert len(keys) >= 8  # sizes, rope, epsilon: the file really holds what the fuzz replaces

    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None,
              derandomize=True)  # the same examples every run: a failure here reproduces
    @given(key=st.sampled_from(keys), bad=BAD_VALUES)
    def check(key, bad):
        f = tmp_path_factory.mktemp("fuzz") / "bad.gguf"
        _write(f, family, {key: bad})
        try:
            cfg = config_from_gguf(open_gguf(f))
        except ValueError as e:
            message = str(e)
            assert key in message or "metadata implies" in message or "file holds tensors" in message, message
        else:
            assert isinstance(cfg, ModelConfig)

    check()
