"""The web page's JSON API (`llamablock serve`), through FastAPI's test client: every endpoint
with good and bad input. Expected numbers are closed forms (stated at each) or the module's.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket

import pytest

pytest.importorskip("fastapi", reason="fastapi is not installed (pip install -e '.[test]')")
pytest.importorskip("httpx", reason="httpx (FastAPI's test client) is not installed")
from fastapi.testclient import TestClient  # noqa: E402

from llamablock.cli import main  # noqa: E402
from llamablock.lab.details_text import render, said  # noqa: E402
from llamablock.util.units import human_bytes  # noqa: E402
from llamablock.web.app import STATIC, create_app  # noqa: E402

FIGURES = ("rope-visualizer", "rope-scaling", "swiglu-gate", "gqa", "token-tracer-compare")


@pytest.fixture(scope="module")
def client():
    return TestClient(create_app())


def error(reply, status: int, parameter: str | None) -> str:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert body["parameter"] == parameter, body
    if parameter:
        assert parameter in body["message"]
    return body["message"]


# -- the page and its files --------------------------------------------------------------------

def test_index_has_five_figures_each_with_try_and_what_happens(client):
    html = client.get("/").text
    for name in FIGURES:
        section = re.search(rf'<section[^>]*id="figure-{name}".*?</section>', html, re.S)
        assert section, name
        assert "<strong>Try:</strong>" in section.group(0)
        assert "<summary>What happens</summary>" in section.group(0)


def test_page_loads_nothing_from_elsewhere(client):
    """Offline: every src/href/import on the page points at this server."""
    html = client.get("/").text
    for url in re.findall(r'(?:src|href)="([^"]+)"', html):
        assert not re.match(r"(https?:)?//", url), url
        if url.startswith("/static/"):
            assert client.get(url).status_code == 200, url
    for script in STATIC.glob("*.js"):
        for target in re.findall(r'(?:import[^"\']*from\s*|import\()\s*["\']([^"\']+)', script.read_text()):
            assert target.startswith("./"), (script.name, target)
            assert (STATIC / target[2:]).is_file(), (script.name, target)
        assert "fetch(\"http" not in script.read_text() and "fetch('http" not in script.read_text()


def _raw_get(app, raw_path: str) -> int:
    """Send a path to the ASGI app exactly as written (HTTP clients remove dot segments)."""
    status = {}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            status["code"] = message["status"]

    scope = {"type": "http", "method": "GET", "path": raw_path, "raw_path": raw_path.encode(),
             "query_string": b"", "headers": [], "http_version": "1.1", "scheme": "http",
             "server": ("testserver", 80), "client": ("test", 1), "root_path": "", "app": app}
    asyncio.run(app(scope, receive, send))
    return status["code"]


@pytest.mark.parametrize("path", ["/static/../app.py", "/static/../../cli.py", "/static/../../../../etc/passwd",
                                  "/static//etc/passwd", "/static/%2e%2e/app.py", "/static/..%2fapp.py"])
def test_nothing_outside_the_static_folder_is_served(client, path):
    assert _raw_get(client.app, path) == 404
    assert client.get(path).status_code == 404


def test_unknown_api_path_is_json_404(client):
    assert error(client.get("/api/no-such-thing"), 404, None).startswith("no such endpoint")


# -- rope-visualizer ---------------------------------------------------------------------------

def _rotate(v, angle):  # the closed form R(angle) v of module 15.1, in float64
    c, s = math.cos(angle), math.sin(angle)
    return [c * v[0] - s * v[1], s * v[0] + c * v[1]]


@pytest.mark.parametrize("m,n,pair,base", [(3, 1, 0, 10000.0), (40, 7, 5, 10000.0), (1000, 1200, 63, 500000.0)])
def test_rope_visualizer_matches_the_rotation_matrix(client, m, n, pair, base):
    d = client.get("/api/rope-visualizer", params=dict(m=m, n=n, pair=pair, base=base)).json()
    theta = base ** (-2 * pair / 128)  # theta_i = base^(-2i/d), module 15.1 counting i from 0
    assert d["theta"] == pytest.approx(theta, rel=1e-6)
    assert d["q_rot"] == pytest.approx(_rotate(d["q"], m * theta), abs=1e-5)
    assert d["k_rot"] == pytest.approx(_rotate(d["k"], n * theta), abs=1e-5)
    # q . R(n - m) k, the identity of 15.1; float32 rounding (the module measures 4.77e-7)
    assert d["dot"] == pytest.approx(d["dot_from_gap"], abs=1e-5)
    expected = sum(a * b for a, b in zip(d["q"], _rotate(d["k"], (n - m) * theta), strict=True))
    assert d["dot"] == pytest.approx(expected, abs=1e-5)


def test_rope_visualizer_shift_leaves_the_score_unchanged(client):
    a = client.get("/api/rope-visualizer", params=dict(m=3, n=1)).json()
    b = client.get("/api/rope-visualizer", params=dict(m=8, n=6)).json()
    assert a["q_rot"] != pytest.approx(b["q_rot"], abs=1e-3)  # the arrows did move
    assert a["dot"] == pytest.approx(b["dot"], abs=1e-6)
    assert a["angle_between_deg"] == pytest.approx(b["angle_between_deg"], abs=1e-4)


@pytest.mark.parametrize("params,status,parameter", [
    (dict(m=-1), 422, "m"), (dict(n="x"), 422, "n"), (dict(m=10**7), 422, "m"),
    (dict(pair=64), 400, "pair"), (dict(pair=-2), 422, "pair"), (dict(head_dim=100), 400, "head_dim"),
    (dict(base="nan"), 422, "base"), (dict(base=1), 422, "base"), (dict(base="inf"), 422, "base"),
    (dict(q0=11), 422, "q0"),
])
def test_rope_visualizer_bad_input(client, params, status, parameter):
    error(client.get("/api/rope-visualizer", params=params), status, parameter)


# -- swiglu-gate -------------------------------------------------------------------------------

def test_swiglu_gate_values(client):
    d = client.get("/api/swiglu-gate", params=dict(gate=2.0, up=-1.5)).json()
    swish = 2.0 / (1 + math.exp(-2.0))  # z sigmoid(z); the module: Swish(2) ~ 1.76
    assert d["at_gate"]["swish"] == pytest.approx(swish, abs=1e-12) and round(swish, 2) == 1.76
    assert d["product"] == pytest.approx(swish * -1.5, abs=1e-12)
    assert d["at_gate"]["gelu"] == pytest.approx(2.0 * 0.5 * (1 + math.erf(2.0 / math.sqrt(2))), abs=1e-12)
    assert d["at_gate"]["relu"] == 2.0
    x, curves = d["x"], d["curves"]
    assert len(x) == len(curves["swish"]) == len(curves["relu"]) == len(curves["gelu"])
    i = min(range(len(x)), key=lambda j: abs(x[j] + 2))
    assert x[i] == pytest.approx(-2) and round(curves["swish"][i], 2) == -0.24  # module: Swish(-2) ~ -0.24


def test_swiglu_gate_closed_for_large_negative_gate(client):
    outs = [client.get("/api/swiglu-gate", params=dict(gate=-8, up=u)).json()["product"] for u in (-8, 0, 8)]
    assert max(abs(o) for o in outs) < 0.03  # |Swish(-8)| = 8 sigmoid(-8) = 0.0027, times at most 8
    assert outs[0] != outs[2]


@pytest.mark.parametrize("params,parameter", [(dict(gate=9), "gate"), (dict(up="abc"), "up"),
                                              (dict(gate="nan"), "gate"), (dict(up=-8.5), "up")])
def test_swiglu_gate_bad_input(client, params, parameter):
    error(client.get("/api/swiglu-gate", params=params), 422, parameter)


# -- gqa ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kv,text", [(32, "4 GiB"), (8, "1 GiB"), (1, "128 MiB")])
def test_gqa_llama3_8b_at_8192_tokens(client, kv, text):
    """Module 15.5: 4 GiB, 1 GiB, 128 MiB; closed form 2 x 32 layers x kv x 128 x 8192 x 2 bytes."""
    d = client.get("/api/gqa", params=dict(preset="llama-3-8b", n_kv_heads=kv, tokens=8192, dtype="float16")).json()
    assert d["cache_text"] == text
    assert d["cache_bytes"] == d["cache_bytes_from_per_token"] == 2 * 32 * kv * 128 * 8192 * 2
    assert d["mha_bytes"] == 4 * 2**30 and d["kv_divisors"] == [1, 2, 4, 8, 16, 32]
    assert d["kv_head_of_query"] == [h // (32 // kv) for h in range(32)]


def test_gqa_defaults_are_the_preset_and_overrides_apply(client):
    d = client.get("/api/gqa").json()
    assert (d["preset"], d["n_heads"], d["n_kv_heads"], d["tokens"], d["cache_text"]) == ("llama-3-8b", 32, 8, 8192, "1 GiB")
    d = client.get("/api/gqa", params=dict(preset="smollm2-135m-instruct", n_layers=2, head_dim=64, tokens=1000,
                                           dtype="float32")).json()
    assert d["cache_bytes"] == 2 * 2 * 3 * 64 * 1000 * 4  # 3 KV heads in SmolLM2-135M (its config.json)


@pytest.mark.parametrize("params,status,parameter", [
    (dict(n_kv_heads=5), 400, "n_kv_heads"), (dict(n_heads=12, n_kv_heads=8), 400, "n_kv_heads"),
    (dict(preset="gpt-5"), 400, "preset"), (dict(preset="x" * 41), 422, "preset"),
    (dict(dtype="float64"), 400, "dtype"), (dict(tokens=0), 422, "tokens"), (dict(tokens=2**21), 422, "tokens"),
    (dict(n_layers="many"), 422, "n_layers"), (dict(head_dim=0), 422, "head_dim"), (dict(n_heads=1000), 422, "n_heads"),
    (dict(head_dim=81), 400, "head_dim"),
])
def test_gqa_bad_input(client, params, status, parameter):
    error(client.get("/api/gqa", params=params), status, parameter)


def test_gqa_sliding_window_shown_beside_the_full_cache(client):
    d = client.get("/api/gqa", params=dict(preset="mistral-7b", tokens=32768)).json()
    assert d["cache_bytes"] == 2 * 32 * 8 * 128 * 32768 * 2  # closed form of 15.5, Mistral's config.json
    assert d["sliding_window"] == 4096 and d["window_bytes"] == 2 * 32 * 8 * 128 * 4096 * 2
    assert d["window_text"] == "512 MiB"
    assert client.get("/api/gqa", params=dict(preset="mistral-7b", tokens=4096)).json()["window_bytes"] is None


def test_gqa_measured_decode_from_the_lab_results(tmp_path):
    path = tmp_path / "results.json"
    assert TestClient(create_app(lab_results=str(path))).get("/api/gqa").json()["measured_decode"] is None
    claim = {"id": "15.5.decode-speed", "verdict": "reproduced", "measured": 3.5,
             "details": [said("15.5.decode-speed misses", ratio=1.02)]}
    path.write_text(json.dumps({"environment": {"date": "2026-11-29 16:00 UTC"}, "claims": [claim]}))
    d = TestClient(create_app(lab_results=str(path))).get("/api/gqa").json()["measured_decode"]
    assert d == {"source": str(path), "date": "2026-11-29 16:00 UTC", "verdict": "reproduced",
                 "ratio_32_to_8": 3.5, "details": render(claim["details"])}
    assert "(32 -> 8: 1.02x)" in d["details"]
    path.write_text("{not json")
    assert TestClient(create_app(lab_results=str(path))).get("/api/gqa").json()["measured_decode"] is None


def test_presets_endpoint(client):
    d = client.get("/api/presets").json()
    assert d["default"] == "llama-3-8b"
    assert d["presets"]["llama-3-8b"] == dict(n_heads=32, n_kv_heads=8, n_layers=32, head_dim=128, max_seq_len=8192)


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1000, "1000 B"), (999 * 1024 + 512, "1000 KiB"), (1234567, "1.18 MiB"), (1536, "1.5 KiB"), (4 * 2**30, "4 GiB"),
                                    (128 * 2**20, "128 MiB"), (1023 * 2**20, "1023 MiB")])
def test_human_bytes(n, text):
    assert human_bytes(n) == text


# -- rope-scaling (llamablock.diagnostics.rope_table) ----------------------------------------------

def test_rope_scaling_module_claim_at_4096_to_32768(client):
    """Module 15.2: trained on 4,096 and run at 32,768, only the slow pairs reach unseen angles;
    interpolation fixes them all; NTK leaves some; YaRN and llama3 leave none."""
    d = client.get("/api/rope-scaling", params=dict(train_len=4096, target_len=32768, head_dim=128)).json()
    by = {m["name"]: m for m in d["methods"]}
    assert {"default", "linear", "ntk", "yarn", "llama3"} <= set(by)
    closed = [2 * math.pi * 10000 ** (2 * i / 128) for i in range(64)]  # 2 pi / theta_i, module 15.1
    assert by["default"]["wavelength"] == pytest.approx(closed, rel=1e-6)
    slow = [w > 4096 for w in closed]
    assert by["default"]["unseen"] == slow and 0 < sum(slow) < 64 and slow[-1] and not slow[0]
    assert by["linear"]["n_unseen"] == 0 and by["linear"]["ratio"] == pytest.approx([8.0] * 64, rel=1e-6)
    assert by["ntk"]["n_unseen"] > 0
    assert by["yarn"]["n_unseen"] == 0 and by["llama3"]["n_unseen"] == 0
    assert by["yarn"]["wavelength"][0] == pytest.approx(closed[0], rel=1e-6)  # fast pair untouched


def test_rope_scaling_no_extension_has_nothing_unseen(client):
    d = client.get("/api/rope-scaling", params=dict(train_len=8192, target_len=8192, head_dim=64, base=500000)).json()
    assert all(m["n_unseen"] == 0 and m["n_crowded"] == 0 for m in d["methods"])


@pytest.mark.parametrize("params,status,parameter", [
    (dict(target_len=1024), 400, "target_len"), (dict(head_dim=100), 400, "head_dim"), (dict(train_len=0), 422, "train_len"),
    (dict(train_len="4k"), 422, "train_len"), (dict(base="nan"), 422, "base"), (dict(target_len=2**25), 422, "target_len"),
])
def test_rope_scaling_bad_input(client, params, status, parameter):
    error(client.get("/api/rope-scaling", params=params), status, parameter)


# -- token-tracer-compare (llamablock.studies.trace) ---------------------------------------------

@pytest.fixture(scope="module")
def trace_client(tmp_path_factory):
    """A client whose tracer pair is trained tiny (2 steps) into a temporary cache, so the test
    does not pay for the real recipe's training; the face is what is tested."""
    from llamablock.studies.trace import ensure_pair
    from llamablock.training.train import TrainConfig

    cache = tmp_path_factory.mktemp("trace-cache")
    ensure_pair(cache, recipe=TrainConfig(steps=2, batch_size=2, context=32, warmup=0, eval_every=2, eval_windows=2))
    return TestClient(create_app(trace_cache_dir=str(cache))), cache


@pytest.mark.slow
def test_token_tracer_passes_the_tracer_through(trace_client):
    from llamablock.studies.trace import is_trained, pair_dirs, trace_pair

    client, cache = trace_client
    assert all(is_trained(run) for run in pair_dirs(cache).values())  # the endpoint will not train
    d = client.get("/api/token-tracer", params=dict(text="ROMEO: But soft", top_k=3)).json()
    direct = trace_pair("ROMEO: But soft", cache_dir=cache, top_k=3)
    assert d["tokens"] == list("ROMEO: But soft") and d["blocks"] == 4
    assert [m["arch"] for m in d["models"]] == ["2017", "2024"]
    for m in d["models"]:
        assert m["stages"] == direct["models"][m["arch"]]["stages"]
        assert m["top"] == direct["models"][m["arch"]]["top"] and len(m["top"]) == 3
    names = {m["arch"]: [s["name"] for s in m["stages"]] for m in d["models"]}
    # Module 15.6: the 2024 model has no position stage; only post-LN reports the normalized stream.
    assert "+ positions" in names["2017"] and "+ positions" not in names["2024"]
    assert "block 1 after attention" in names["2017"] and "block 1 after attention" in names["2024"]
    assert all("normalized" in s for s in d["models"][0]["stages"] if s["name"].startswith("block"))


def test_token_tracer_without_training_answers_409_and_trains_nothing(tmp_path):
    """train=false (what the page asks on load) never starts the first-use training."""
    from llamablock.studies.trace import pair_dirs

    client = TestClient(create_app(trace_cache_dir=str(tmp_path)))
    assert "first trace trains" in error(client.get("/api/token-tracer", params=dict(train="false")), 409, "train")
    assert not any(run.exists() for run in pair_dirs(tmp_path).values())


def test_token_tracer_with_the_pair_trained_traces_without_training_flag(trace_client):
    assert trace_client[0].get("/api/token-tracer", params=dict(text="To be", train="false")).status_code == 200


@pytest.mark.slow
@pytest.mark.parametrize("params,status,parameter", [
    (dict(text=""), 422, "text"), (dict(text="x" * 201), 422, "text"), (dict(text="café ☃"), 400, "text"),
    (dict(top_k=0), 422, "top_k"), (dict(top_k="five"), 422, "top_k"),
])
def test_token_tracer_bad_input(trace_client, params, status, parameter):
    message = error(trace_client[0].get("/api/token-tracer", params=params), status, parameter)
    if status == 400:
        assert "not in the vocabulary" in message


# -- the command -------------------------------------------------------------------------------

def test_serve_rejects_a_bad_port(capsys):
    assert main(["serve", "--port", "70000"]) == 2
    assert "--port must be in 1..65535" in capsys.readouterr().err


def test_serve_reports_a_taken_port(capsys):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
