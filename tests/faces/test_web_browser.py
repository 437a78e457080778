"""The page in a real browser: Debian's chromium, headless, driven by Playwright's Python package.

Skipped, with the reason, where chromium or playwright is missing (CI installs chromium with
apt-get where it can: see .ci/run). Screenshots of each figure go to artifacts/web/ (ignored
by git); docs/screenshots/ holds copies of them for the README.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip("Debian's chromium is not installed (apt-get install -y chromium); browser tests skipped",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
uvicorn = pytest.importorskip("uvicorn", reason="uvicorn is not installed")

from llamablock.web.app import create_app  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "web"
FIGURES = ("rope-visualizer", "rope-scaling", "swiglu-gate", "gqa", "token-tracer-compare")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 20_000


def tiny_trace_cache(root: Path) -> str:
    """The tracer's pair trained for 2 steps, not the real recipe: the page is under test here,
    not the models."""
    from llamablock.studies.trace import ensure_pair
    from llamablock.training.train import TrainConfig

    ensure_pair(root, recipe=TrainConfig(steps=2, batch_size=2, context=32, warmup=0, eval_every=2, eval_windows=2))
    return str(root)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cache = tiny_trace_cache(tmp_path_factory.mktemp("trace-cache"))
    yield from _serve(cache)


def _serve(cache: str):
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(trace_cache_dir=cache), log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the test server did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True, args=ARGS,
            viewport={"width": 1100, "height": 900}, device_scale_factor=1)
        context.set_default_timeout(TIMEOUT_MS)
        yield context
        context.close()


@pytest.fixture
def page(browser, server):
    """The page, loaded, every figure started; console errors collected in page.errors."""
    pg = browser.new_page()
    pg.errors = []
    pg.on("console", lambda m: pg.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(f"page error: {e}"))
    pg.on("requestfailed", lambda r: pg.errors.append(f"request failed: {r.url}"))
    pg.goto(server + "/")
    for name in FIGURES:
        pg.wait_for_function(f"document.getElementById('figure-{name}').dataset.state !== 'loading'")
    yield pg
    pg.close()


def state(page, name):
    return page.get_attribute(f"#figure-{name}", "data-state")


def drawing(page, name) -> str:
    return page.inner_html(f"#figure-{name} .plot") + page.inner_text(f"#figure-{name} .readout")


def wait_changed(page, name, before: str) -> None:
    page.wait_for_function(
        """([id, before]) => {
             const s = document.getElementById(id);
             return s.dataset.state === 'ready'
               && s.querySelector('.plot').innerHTML + s.querySelector('.readout').innerText !== before; }""",
        arg=[f"figure-{name}", before])


@pytest.mark.slow  # the first test pays for the tiny tracer training of the module's server
def test_page_loads_without_console_errors_and_screenshots(page):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name in FIGURES:
        assert state(page, name) == "ready", (name, page.inner_text(f"#figure-{name} .error"))
        page.locator(f"#figure-{name}").screenshot(path=str(ARTIFACTS / f"{name}.png"))
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 5000
    assert page.errors == []


SLIDERS = {"rope-visualizer": 3, "rope-scaling": 1, "swiglu-gate": 2, "gqa": 3}


def test_every_slider_changes_its_figure(page):
    for name, count in SLIDERS.items():
        sliders = page.locator(f"#figure-{name} input[type=range]").all()
        assert len(sliders) == count, name
        for slider in sliders:
            before = drawing(page, name)
            at_max = slider.evaluate("s => Number(s.value) >= Number(s.max)")
            slider.press("ArrowLeft" if at_max else "ArrowRight")
            wait_changed(page, name, before)
    assert page.errors == []


def test_rope_shift_both_leaves_the_dot_product_unchanged(page):
    dot = page.locator("#figure-rope-visualizer [data-value=dot]")
    for m, n in ((3, 1), (20, 33)):
        page.eval_on_selector("#figure-rope-visualizer form", f"""f => {{ f.m.value = {m}; f.n.value = {n};
            f.dispatchEvent(new Event('input')); }}""")
        page.wait_for_function(f"""() => {{ const s = document.getElementById('figure-rope-visualizer');
            return s.dataset.state === 'ready' && s.querySelector('output[data-for=m]').textContent === '{m}'; }}""")
        before, arrows = dot.inner_text(), drawing(page, "rope-visualizer")
        page.click("#figure-rope-visualizer button[data-shift='1']")
        page.wait_for_function(f"""() => {{ const s = document.getElementById('figure-rope-visualizer');
            return s.dataset.state === 'ready' && s.querySelector('output[data-for=m]').textContent === '{m + 5}'
              && s.querySelector('output[data-for=n]').textContent === '{n + 5}'; }}""")
        assert drawing(page, "rope-visualizer") != arrows  # both arrows turned
        assert dot.inner_text() == before  # the score did not
    assert page.errors == []


def test_gqa_llama3_8b_cache_sizes(page):
    fig = "#figure-gqa"
    assert page.input_value(f"{fig} select[name=preset]") == "llama-3-8b"
    assert page.inner_text(f"{fig} output[data-for=tokens]") == "8,192"
    for kv, text in (("32", "4 GiB"), ("8", "1 GiB"), ("1", "128 MiB")):  # module 15.5
        page.select_option(f"{fig} select[name=n_kv_heads]", kv)
        page.wait_for_function(f"""() => {{ const s = document.getElementById('figure-gqa');
            return s.dataset.state === 'ready' && s.querySelector('[data-value=cache]').textContent === '{text}'; }}""")
        assert page.locator(f"{fig} .kv-head").count() == int(kv)
        assert page.locator(f"{fig} .q-head").count() == 32
    assert page.errors == []


def test_what_happens_is_revealed_on_request(page):
    for name in FIGURES:
        answer = page.locator(f"#figure-{name} details p")
        assert not answer.is_visible()
        page.click(f"#figure-{name} details summary")
        assert answer.is_visible() and len(answer.inner_text()) > 80


def test_a_bad_value_is_reported_naming_the_parameter(page):
    page.fill("#figure-rope-scaling input[name=train_len]", "0")
    page.wait_for_function("document.getElementById('figure-rope-scaling').dataset.state === 'error'")
    assert page.inner_text("#figure-rope-scaling .error").startswith("train_len:")
    page.fill("#figure-rope-scaling input[name=train_len]", "4096")
    page.wait_for_function("document.getElementById('figure-rope-scaling').dataset.state === 'ready'")
    assert page.inner_text("#figure-rope-scaling .error") == ""


def test_tracer_block_stage_and_text(page):
    fig = "#figure-token-tracer-compare"
    assert page.locator(f"{fig} .readout .model").count() == 2  # 2017 and 2024 side by side
    assert page.get_attribute(f"{fig} rect.chosen >> nth=0", "data-stage") == "block 1 after attention"
    for block, stage in (("2", "feed-forward"), ("4", "attention")):
        before = drawing(page, "token-tracer-compare")
        page.select_option(f"{fig} select[name=block]", block)
        page.select_option(f"{fig} select[name=stage]", stage)
        assert drawing(page, "token-tracer-compare") != before
        chosen = page.locator(f"{fig} rect.chosen")
        assert chosen.count() == 2 and chosen.first.get_attribute("data-stage") == f"block {block} after {stage}"
    page.fill(f"{fig} input[name=text]", "To be")
    page.click(f"{fig} button[name=run]")
    page.wait_for_function("""() => { const s = document.getElementById('figure-token-tracer-compare');
        return s.dataset.state === 'ready' && s.querySelector('select[name=token]').options.length === 5; }""")
    assert page.errors == []
    page.fill(f"{fig} input[name=text]", "caf\u00e9")
    page.click(f"{fig} button[name=run]")
    page.wait_for_function("document.getElementById('figure-token-tracer-compare').dataset.state === 'error'")
    assert page.inner_text(f"{fig} .error").startswith("text:")


def test_tracer_waits_for_a_press_when_its_models_are_not_trained(browser, tmp_path):
    """On load the page asks the tracer not to train (train=false); with an empty cache it shows
    how to start instead of training both models because someone opened the page."""
    from llamablock.studies.trace import pair_dirs

    for url in _serve(str(tmp_path)):
        pg = browser.new_page()
        pg.goto(url + "/")
        pg.wait_for_function("document.getElementById('figure-token-tracer-compare').dataset.state === 'idle'")
        assert pg.inner_text("#figure-token-tracer-compare .hint-run").startswith("Press Trace to start")
        pg.close()
    assert not any(run.exists() for run in pair_dirs(tmp_path).values())
