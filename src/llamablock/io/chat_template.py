"""Chat templates rendered as transformers renders them, within bounds of size and time.

jinja2's sandbox limits what a template may touch, not how much it computes: a model file's
template (untrusted text) could hang the loader or the server with `9 ** 999999999` (one C-level
operation), or write gigabytes with `"x" * 10**9` or a loop. `BoundedSandbox` is
`ImmutableSandboxedEnvironment` whose documented hooks refuse those before they run:

  * `**`, `*`, `+` and `%` go through `call_binop` (`intercepted_binops`): an integer past
    MAX_INT_BITS bits, or a string or list past MAX_CHARS, is refused before it is computed;
  * `~` (jinja2's concatenation) is compiled to a join that checks the length first;
  * calls and filters may not pass an integer past MAX_ARG, nor make a string or list past
    MAX_CHARS (`join` and `replace` are checked before they run, the rest on their result);
  * the output is streamed (`Template.generate`) and stopped once it passes MAX_CHARS;
  * the Python lines the render runs are counted (`sys.settrace`) and stopped past TEMPLATE_STEPS.
Any of these raises `TemplateError` with what was refused. Real templates compute none of this.

`render_isolated` renders in a child process with a time and memory limit, for the server: an
operation in C that these checks do not know of would hold the interpreter lock, and so the whole
server, for as long as it runs; a child process can be killed.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
from functools import wraps

from jinja2.compiler import CodeGenerator
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_CHARS = 4 << 20  # characters of the output, and of any string or list made on the way
MAX_INT_BITS = 1 << 16  # bits of an integer a template may make (about 20,000 digits)
MAX_ARG = 1 << 20  # largest integer passed to a call or filter (a width, a count)
TEMPLATE_STEPS = 1_000_000  # lines of the compiled template a render may run: far past any real chat
_WIDE = re.compile(r"[%{][^%{}]*?(\d{7,}|\*)")  # a format width or precision of 7+ digits, or taken from an argument


def _size(value) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict)) else 1


def _refuse(what: str):
    raise TemplateError(f"it {what} (limits: {MAX_CHARS:,} characters, {MAX_INT_BITS:,}-bit integers)")


def _check_binop(op: str, left, right) -> None:
    ints = isinstance(left, int) and isinstance(right, int)
    if op == "**" and ints and right > 0 and right * max(1, abs(left).bit_length() - 1) > MAX_INT_BITS:
        _refuse(f"computes {left} ** {right}, an integer of about {right * abs(left).bit_length():,} bits")
    if op == "*" and ints and left.bit_length() + right.bit_length() > MAX_INT_BITS:
        _refuse("multiplies integers into one past the limit")
    if op == "*" and not ints:
        count, seq = (right, left) if isinstance(right, int) else (left, right)
        if isinstance(count, int) and isinstance(seq, (str, list, tuple)) and count * len(seq) > MAX_CHARS:
            _refuse(f"repeats a {type(seq).__name__} of {len(seq):,} items {count:,} times")
    if op == "+" and isinstance(left, (str, list, tuple)) and _size(left) + _size(right) > MAX_CHARS:
        _refuse(f"adds a {type(left).__name__} past the limit")
    if op == "%" and isinstance(left, str) and _WIDE.search(left):
        _refuse("formats with a width past the limit")


def _checked(value):
    if isinstance(value, (str, list, tuple)) and len(value) > MAX_CHARS:
        _refuse(f"made a {type(value).__name__} of {len(value):,} items")
    return value


def _check_args(args, kwargs) -> None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and abs(a) > MAX_ARG:
            _refuse(f"passes {a} to a call (at most {MAX_ARG:,})")


def _check_join(sep, items: list) -> list:
    if sum(len(str(i)) for i in items) + len(str(sep)) * len(items) > MAX_CHARS:
        _refuse(f"joins {len(items):,} items past the limit")
    return items


def _check_replace(s: str, old, new, count=-1) -> None:
    if isinstance(old, str) and isinstance(new, str):
        n = (len(s) + 1 if old == "" else s.count(old)) if count is None or count < 0 else count
        if len(s) + n * len(new) > MAX_CHARS:
            _refuse("replaces into a string past the limit")


class _BoundedCodeGenerator(CodeGenerator):
    """Compiles `a ~ b` to `environment.bounded_join(...)`, which checks the length before joining."""

    def visit_Concat(self, node, frame) -> None:
        self.write("environment.bounded_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox with sizes bounded (see the module's docstring); filters are wrapped on creation."""

    intercepted_binops = frozenset({"**", "*", "+", "%"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, **options):
        super().__init__(**options)
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}

    def bounded_join(self, parts) -> str:
        texts = [str(p) for p in parts]
        if sum(map(len, texts)) > MAX_CHARS:
            _refuse("concatenates (~) a string past the limit")
        return "".join(texts)

    def call_binop(self, context, operator, left, right):
        _check_binop(operator, left, right)
        return _checked(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's own signature)
        _check_args(args, kwargs)
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str) and getattr(__obj, "__name__", "") == "join" and args:
            args = (_check_join(owner, list(args[0])), *args[1:])
        if isinstance(owner, str) and getattr(__obj, "__name__", "") == "replace" and len(args) >= 2:
            _check_replace(owner, *args[:3])
        return _checked(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value):
        if isinstance(getattr(value, "__self__", None), str) and _WIDE.search(value.__self__):
            def refused(*args, **kwargs):
                _refuse("formats with a width past the limit")
            return refused
        return super().wrap_str_format(value)


def _bounded_filter(name: str, f):
    """`f` refusing integer arguments past MAX_ARG and results past MAX_CHARS; `join` and `replace`
    checked before they run. The wrapper keeps jinja2's pass_context/pass_eval_context mark (wraps
    copies it), so it is called with the same arguments."""
    passes = getattr(f, "jinja_pass_arg", None) is not None

    @wraps(f)
    def bounded(*args, **kwargs):
        own = args[1:] if passes else args  # drop the context jinja2 passes first
        _check_args(own[1:], kwargs)
        if name == "join" and own:
            items = _check_join(own[1] if len(own) > 1 else kwargs.get("d", ""), list(own[0]))
            args = (*args[:len(args) - len(own)], items, *own[1:])
        if name == "replace" and len(own) >= 3 and isinstance(own[0], str):
            _check_replace(own[0], *own[1:4])
        return _checked(f(*args, **kwargs))

    return bounded


def render(template: str, special: dict, messages: list[dict], add_generation_prompt: bool) -> str:
    """`template` rendered as transformers renders it (trim_blocks, lstrip_blocks, `raise_exception`,
    a `tojson` filter, `strftime_now`), within the bounds above; TemplateError past them."""

    def raise_exception(message):
        raise TemplateError(message)

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _bounded_filter(
        "tojson", lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent))
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)  # as transformers (Llama 3)

    def run() -> str:
        compiled = env.from_string(template)  # constant parts are computed here: inside the bounds too
        out, size = [], 0
        for piece in compiled.generate(messages=messages, add_generation_prompt=add_generation_prompt, **special):
            size += len(piece)
            if size > MAX_CHARS:
                _refuse(f"wrote more than {MAX_CHARS:,} characters")
            out.append(piece)
        return "".join(out)

    return _stepped(run)


def _stepped(run):
    """Run `run()` counting the lines it executes (sys.settrace) and stop it past TEMPLATE_STEPS:
    nested loops over range() hung the loader. Rendering a real template takes a few thousand lines."""
    steps = [0]

    def trace(frame, event, arg):
        if event == "line":
            steps[0] += 1
            if steps[0] > TEMPLATE_STEPS:
                raise TemplateError(f"it ran past {TEMPLATE_STEPS:,} steps (a loop without end?)")
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        return run()
    finally:
        sys.settrace(previous)


# -- in a child process: a time and memory limit that no C-level operation escapes ----------------

TEMPLATE_SECONDS = 10  # wall-clock time a render in a child process may take: real ones take milliseconds
TEMPLATE_MEMORY = 2 << 30  # bytes of address space the child may map


class RenderFailed(Exception):
    """A render in the child process failed; the message is "<exception type>: <message>"."""


def render_isolated(template: str, special: dict, messages: list[dict], add_generation_prompt: bool,
                    seconds: float | None = None) -> str:
    """`render` in a child process killed after `seconds` (default TEMPLATE_SECONDS) and limited
    to TEMPLATE_MEMORY: the bounds above stop every operation known to blow up, and this stops any
    other, since an operation in C holds the interpreter lock and no thread of the server could
    interrupt it. The children stay up between renders (WORKERS of them, one render at a time
    each): starting Python for every render delayed each request's first token, and staggered
    requests that arrived together on their way to the scheduler (`llamablock bench serve`). A
    child that runs past its time, or dies, is replaced by a fresh one at the next render."""
    job = json.dumps({"template": template, "special": special, "messages": messages,
                      "add_generation_prompt": add_generation_prompt})
    out = _pool.run(job, TEMPLATE_SECONDS if seconds is None else seconds)
    if "error" in out:
        raise RenderFailed(out["error"])
    return out["text"]


WORKERS = 2  # as many as the server's threads that render requests (web/api_openai.py)


class _Child:
    """One render process: a job per line of JSON on its stdin, its answer a line on its stdout."""

    def __init__(self):
        import os
        import subprocess
        import tempfile

        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this process's llamablock
        # Its stderr goes to a file, read only when it fails: a pipe that nobody reads would stop a
        # child that wrote more than the pipe holds (warnings, over a server's lifetime).
        self.errors = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, "-c", "from llamablock.io.chat_template import _child; _child()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
                                     text=True, env=env)

    def run(self, job: str, limit: float) -> dict | None:
        """The child's answer, or None when it ran past `limit` seconds or died (it is then gone)."""
        import select

        try:
            self.proc.stdin.write(job + "\n")
            self.proc.stdin.flush()
        except OSError:
            return None
        ready, _, _ = select.select([self.proc.stdout], [], [], limit)
        line = self.proc.stdout.readline() if ready else ""
        try:
            return json.loads(line) if line.endswith("\n") else None
        except ValueError:  # a line cut short: the child died while writing it
            return None

    def why_gone(self) -> str:
        self.proc.kill()
        self.proc.wait()
        self.errors.seek(0)
        lines = self.errors.read().strip().splitlines()
        self.errors.close()
        return lines[-1][:200] if lines else f"exit status {self.proc.returncode}"


class _Pool:
    """Up to WORKERS render processes, started on first use; a job waits for an idle one."""

    def __init__(self):
        import queue
        import threading

        self.idle: queue.Queue = queue.Queue()
        self.started, self.lock = 0, threading.Lock()

    def run(self, job: str, limit: float) -> dict:
        import time

        with self.lock:
            fresh = self.idle.empty() and self.started < WORKERS
            if fresh:
                self.started += 1
        try:
            child = _Child() if fresh else self.idle.get()
        except OSError:  # no process could start: the next render tries again
            with self.lock:
                self.started -= 1
            raise
        started = time.monotonic()
        out = child.run(job, limit)
        if out is not None:
            self.idle.put(child)
            return out
        ran = time.monotonic() - started
        why = child.why_gone()
        with self.lock:
            self.started -= 1
        if ran >= limit:
            raise RenderFailed(f"TemplateError: it ran past {limit:g} s")
        raise RenderFailed(f"TemplateError: the render's process failed: {why}")


_pool = _Pool()


def _child() -> None:
    """The child's side of `render_isolated`: a job per line on stdin, {"text"} or {"error"} per line
    on stdout, until stdin closes (the server has gone)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (TEMPLATE_MEMORY, TEMPLATE_MEMORY))
    for line in sys.stdin:
        job = json.loads(line)
        try:
            out = {"text": render(job["template"], job["special"], job["messages"], job["add_generation_prompt"])}
        except Exception as e:  # noqa: BLE001 (reported to the parent, which raises it)
            out = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
