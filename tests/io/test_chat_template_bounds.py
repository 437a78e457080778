"""Chat templates within bounds: a model file's template is untrusted text, and jinja2's
sandbox bounds what it touches, not what it computes. One C-level `9 ** 999999999` hung the loader
(the step budget never saw it), and a loop writing 2.5 GB aborted it. Each is refused now, fast,
with a ValueError naming the template; real templates render as before (test_tokenizer.py and
test_gguf_families.py compare them with transformers').

Every template that could hang is rendered in a child process with a timeout, so a regression
fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as Backend
from tokenizers import models

from llamablock.io import chat_template
from llamablock.io.chat_template import MAX_CHARS, RenderFailed, render_isolated
from llamablock.io.tokenizer import Tokenizer

LIMIT_S = 20  # a refused template answers in milliseconds; a regression would run for minutes or for ever
HI = [{"role": "user", "content": "hi"}]


CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a blow-up is a MemoryError, not the machine's memory
from llamablock.io.chat_template import render
try:
    text = render(sys.stdin.read(), {}, [{"role": "user", "content": "hi"}], True)
    print(json.dumps({"length": len(text)}))
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
"""


def render_in_child(template: str) -> dict:
    """The template rendered in a child process, killed after LIMIT_S: a C-level operation holds
    the GIL (no thread or signal of this process could stop it), so a regression fails here instead
    of hanging the suite. {"length": n} or {"error": "TemplateError: ..."}."""
    try:
        done = subprocess.run([sys.executable, "-c", CHILD], input=template, capture_output=True, text=True,
                              timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the render was still running after {LIMIT_S} s")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def tok_with(template: str) -> Tokenizer:
    return Tokenizer(Backend(models.BPE({"a": 0}, [])), None, [], None, False, template, "the test's template")


def render(template: str, messages=HI) -> str:
    """In this process: for templates that cannot hang (what they compute is small)."""
    return tok_with(template).apply_chat_template(messages)


@pytest.mark.parametrize("template", [
    pytest.param("{{ 9 ** 999999999 }}", id="power-one-c-operation-hung"),
    pytest.param("{% set n = 999999999 %}{{ 9 ** n }}", id="power-from-a-variable"),
    pytest.param("{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}"
                 "{{ ns.x }}", id="squaring-loop"),
    pytest.param("{{ 'x' * 999999999 }}", id="string-repetition"),
    pytest.param("{{ ([1] * 999999999) | length }}", id="list-repetition"),
    pytest.param("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
                 "{{ ns.s | length }}", id="concat-doubling"),
    pytest.param("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"
                 "{{ ns.s | length }}", id="plus-doubling"),
    pytest.param("{{ 'x' | center(999999999) }}", id="filter-width"),
    pytest.param("{{ 'x'.center(999999999) }}", id="method-width"),
    pytest.param("{{ '%0999999999d' % 1 }}", id="percent-width"),
    pytest.param("{{ '{:0999999999}'.format(1) }}", id="format-width"),
    pytest.param("{{ ('x' * 60000).replace('', 'y' * 60000) | length }}", id="replace-empty"),
    pytest.param("{{ (['x' * 4000000] * 1000) | join('') | length }}", id="join-filter"),
    pytest.param("{{ ''.join(['x' * 4000000] * 1000) | length }}", id="join-method"),
    pytest.param("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", id="output-past-the-cap"),
])
def test_templates_that_compute_or_write_too_much_are_refused_fast(template):
    out = render_in_child(template)
    assert "error" in out and re.match(r"TemplateError: it .*limit", out["error"]), out


def test_a_refusal_names_the_template():
    with pytest.raises(ValueError, match="chat template failed: TemplateError: it computes 9 \\*\\* 999999999.*"
                                         "the test's template"):
        render("{{ 9 ** 999999999 }}")


def test_the_output_cap_is_on_what_is_written():
    """Writing exactly MAX_CHARS passes; one more character is refused."""
    assert len(render(f"{{% for i in range({MAX_CHARS // 4096}) %}}{{{{ 'x' * 4096 }}}}{{% endfor %}}")) == MAX_CHARS
    with pytest.raises(ValueError, match="wrote more than"):
        render(f"{{% for i in range({MAX_CHARS // 4096}) %}}{{{{ 'x' * 4096 }}}}{{% endfor %}}y")


def test_ordinary_arithmetic_and_filters_still_work():
    t = ("{{ 2 ** 10 }} {{ 3 * 4 }} {{ 'ab' * 3 }} {{ [1, 2] + [3] }} {{ '%05d' % 42 }} {{ '{:>4}'.format('x') }} "
         "{{ messages | map(attribute='content') | join(', ') }} {{ 'a-b'.replace('-', '+') }} {{ 'x' | center(5) }}"
         "{{ messages[0] | tojson }}")
    assert render(t) == ("1024 12 ababab [1, 2, 3] 00042    x hi a+b   x  "
                         '{"role": "user", "content": "hi"}')


def test_the_limits_can_be_lowered_for_a_test(monkeypatch):
    monkeypatch.setattr(chat_template, "MAX_CHARS", 10)
    with pytest.raises(ValueError, match="wrote more than 10"):
        render("{{ 'x' * 5 }}{{ 'y' * 6 }}")


# -- in a child process: a time limit nothing escapes ------------------------------------------------

# Within every bound of size and steps (4M-item lists, some 50,000 lines) but minutes of C-level sums.
SLOW = "{% set big = range(100000) | list %}{% for i in range(10000) %}{% set x = (big * 40) | sum %}{% endfor %}done"


def test_an_isolated_render_is_stopped_at_its_time_limit():
    start = time.monotonic()
    with pytest.raises(RenderFailed, match="TemplateError: it ran past 2 s"):
        render_isolated(SLOW, {}, HI, True, seconds=2)
    assert time.monotonic() - start < LIMIT_S


def test_isolated_renders_reuse_a_child_and_one_past_its_time_is_replaced():
    """The children stay up between renders (no Python start per request), and a child killed at its
    time limit is replaced: the next render answers."""
    t = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert render_isolated(t, {}, HI, True) == "hi"
    children = {c.proc.pid for c in list(chat_template._pool.idle.queue)}
    assert render_isolated(t, {}, HI, True) == "hi"
    assert {c.proc.pid for c in list(chat_template._pool.idle.queue)} == children  # the same processes
    with pytest.raises(RenderFailed, match="ran past 1 s"):
        render_isolated(SLOW, {}, HI, True, seconds=1)
    assert render_isolated(t, {}, HI, True) == "hi"
    for child in list(chat_template._pool.idle.queue):  # children that die between renders
        child.proc.kill()
        child.proc.wait()
    with pytest.raises(RenderFailed, match="the render's process failed"):
        render_isolated(t, {}, HI, True)
    while chat_template._pool.idle.qsize():  # the other dead one, if two were up
        with pytest.raises(RenderFailed):
            render_isolated(t, {}, HI, True)
    assert render_isolated(t, {}, HI, True) == "hi"
    assert chat_template._pool.started <= chat_template.WORKERS


def test_a_child_that_dies_mid_answer_counts_as_gone():
    """A child that writes part of its answer line and exits: no answer (None), not a JSON error that
    would leave the pool a child short for good."""
    child = chat_template._Child()
    child.proc.kill()
    child.proc.wait()
    child.proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline(); "
                                   "sys.stdout.write('{\"te'); sys.stdout.flush()"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.run('{"job": 1}', 10) is None
    assert child.why_gone()


def test_an_isolated_render_gives_the_same_text_and_errors():
    t = "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% endfor %}"
    assert render_isolated(t, {"bos_token": "<s>"}, HI, True) == chat_template.render(t, {"bos_token": "<s>"}, HI, True)
    with pytest.raises(RenderFailed, match=r"TemplateError: it computes 9 \*\* 999999999"):
        render_isolated("{{ 9 ** 999999999 }}", {}, HI, True)
    with pytest.raises(ValueError, match="chat template failed: TemplateError: it computes 9.*the test's template"):
        tok_with("{{ 9 ** 999999999 }}").apply_chat_template(HI, isolated=True)


# -- hypothesis: any template built from a grammar of risky pieces renders or is refused, in bounds --

NUMBERS = st.sampled_from(["2", "9", "999999999", "10**6", "n", "-3", "0", "2.5", "'ab'", "[1, 2]"])
OPS = st.sampled_from(["**", "*", "+", "%", "~", "//", "-"])
EXPR = st.builds(lambda a, op, b: f"({a} {op} {b})", NUMBERS, OPS, NUMBERS)
PIECE = st.one_of(
    EXPR.map(lambda e: "{{ " + e + " }}"),
    st.builds(lambda e, k: f"{{% for i in range({k}) %}}{{{{ {e} }}}}{{% endfor %}}", EXPR,
              st.sampled_from(["3", "1000", "100000"])),
    st.builds(lambda e, k: f"{{% set ns = namespace(x={e}) %}}{{% for i in range({k}) %}}{{% set ns.x = ns.x * ns.x "
                           f"%}}{{% endfor %}}{{{{ ns.x | string | length }}}}", NUMBERS, st.sampled_from(["2", "40"])),
    st.builds(lambda w: "{{ 'x' | center(" + w + ") }}", NUMBERS),
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(PIECE, min_size=1, max_size=3))
def test_any_template_renders_within_the_cap_or_is_refused_quickly(pieces):
    template = "{% set n = 999999999 %}" + "".join(pieces)
    out = render_in_child(template)
    # an error of the template's own (a TypeError, say) is a clean refusal too: the loader reports it
    assert "error" in out or out["length"] <= MAX_CHARS, out
