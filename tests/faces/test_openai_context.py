"""The context in force behind /v1 (serve's --ctx-size and RoPE-scaling flags): /v1/models says it,
and a request longer than it gets OpenAI's 400 `context_length_exceeded`, never a truncation.

A tiny run trained to 16 positions (tests/tiny_run.py; a character tokenizer, so a prompt of n
characters is n tokens and no end token stops a reply early) is served as `llamablock serve`
loads it (web.generation.load_served), once as it is and once with `--ctx-size 64 --rope-scaling
yarn`, on a real local port. The official `openai` client is used where it reads the field.
"""

from __future__ import annotations

import argparse

import pytest
from live_server import live_server
from tiny_run import make_run

from llamablock.io.scaling_flags import add_scaling_arguments
from llamablock.web.app import create_app
from llamablock.web.generation import load_served

httpx = pytest.importorskip("httpx")
WAIT = 60  # a hang guard, never a measurement


def _flags(argv):
    p = argparse.ArgumentParser()
    add_scaling_arguments(p)
    return p.parse_args(argv)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("ctx") / "run", steps=2)


def _serve(run, argv):
    served = load_served(str(run), max_queue=2, parallel=1, engine="eager", scaling=_flags(argv))
    return served, live_server(create_app(served=served), WAIT)


def _complete(port, prompt: str, max_tokens: int) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=WAIT,
                      json={"model": "run", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})


def test_an_extended_context_is_listed_and_served_in_full(run):
    served, server = _serve(run, ["--ctx-size", "64", "--rope-scaling", "yarn"])
    with server as port:
        card = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=WAIT).json()["data"][0]
        assert card["max_model_len"] == 64 and card["meta"]["n_ctx"] == 64
        assert card["meta"]["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 16}
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models/run", timeout=WAIT).json()["max_model_len"] == 64
        r = _complete(port, "ROMEO:\nBut soft, what light", 30)  # 27 + 30 tokens: past 16, within 64
        assert r.status_code == 200, r.text
        assert r.json()["usage"] == {"prompt_tokens": 27, "completion_tokens": 30, "total_tokens": 57}
        r = _complete(port, "ROMEO:\nBut soft, what light", 38)  # 65 tokens: one past the context
        assert r.status_code == 400
        err = r.json()["error"]
        assert (err["code"], err["param"], err["type"]) == ("context_length_exceeded", "max_tokens",
                                                            "invalid_request_error")
        assert "maximum context length is 64 tokens" in err["message"] and "65 tokens" in err["message"]
        r = _complete(port, "a" * 64, 1)  # the prompt alone fills it
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert r.json()["error"]["code"] == "context_length_exceeded"


def test_without_flags_the_trained_context_is_in_force(run):
    openai = pytest.importorskip("openai")
    served, server = _serve(run, [])
    with server as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=WAIT)
        model = client.models.list().data[0]
        assert model.max_model_len == 16 and model.meta["rope_scaling"] is None
        with pytest.raises(openai.BadRequestError) as e:  # 10 + 10 > 16: refused, not shortened
            client.completions.create(model="run", prompt="ROMEO:\nBut", max_tokens=10)
        assert e.value.body["code"] == "context_length_exceeded"
        assert client.completions.create(model="run", prompt="ROMEO:\nBut", max_tokens=6).usage.total_tokens == 16
