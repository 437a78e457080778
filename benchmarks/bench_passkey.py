"""Passkey retrieval through `llamablock generate` at twice SmolLM2-135M's trained context, with
`--ctx-size 16384 --rope-scaling yarn`, beside the unscaled model.

The prompts are studies/passkey.py's (the passkey paper's task, filler and question; a five-digit
key at 10%, 50% and 90% of the filler), handed as text to the command itself: `llamablock generate
--prompt TEXT --json --greedy --max-new-tokens 8 ...flags` (its entry, llamablock.cli.main, called
for each prompt in one child process per row), so that the flags, the model source they make, the
plan (the file's own precision: what a user gets), the engine and the request checks are the
command's. An answer is right when the key is in its decoded new tokens, as `rope eval --task
passkey` scores it; the command's token ids of each prompt are checked against
studies.passkey.passkey_prompt's.

Rows: the command at 2L with YaRN; the unscaled model through the same command in its own context
(prompts of L tokens: `--ctx-size 2L` without a method, or with `--rope-scaling none`, is refused,
and the notes quote the refusal); and on the same 2L prompts, `rope eval`'s own scoring
(studies.passkey.greedy on the float32 Decoder that studies.context_extension.method_model makes),
for each method of COMPARE on its first COMPARE_KEYS keys per depth: `none` is plain RoPE past L
(what the command refuses), `yarn` is compared with the command's answers token by token.
--quick: L taken as 256 (`--yarn-orig-ctx 256 --rope-scale 2`, prompts of 512 tokens), one key
per depth, both rope eval methods.
"""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import time

import torch

from benchmarks.common import Section

NAME = "passkey"
CLAIM = ("the passkey task through `generate --ctx-size 2L --rope-scaling yarn` (not only `rope eval`): accuracy "
         "at 2x, beside the unscaled model (issue 44)")
KEYS = 2  # keys per depth through the command (each 2L prompt is a prefill of 2L tokens: minutes on a CPU)
COMPARE = ("none", "yarn")  # rope eval's scoring on the same 2L prompts
COMPARE_KEYS = 1  # of the KEYS keys per depth, how many rope eval's scoring also answers
SEED = 0


# The command's own entry, run in a child process (benchmarks sit below the command line's layer):
# each argv of the JSON list on stdin through llamablock.cli.main, one [exit status, its JSON object
# or error line] per argv on the last line of stdout.
CHILD = """
import contextlib, io, json, sys
from llamablock import cli
done = []
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    done.append([code, json.loads(out.getvalue().strip().splitlines()[-1]) if code == 0 else err.getvalue().strip()])
print(json.dumps(done))
"""


def generate(model: str | None, texts: list[str], flags: list[str], new: int) -> list[tuple[int, dict | str]]:
    """`llamablock generate --json --greedy` on each of `texts`, one after the other in one child
    process, each call reading the model as the command does: (0, its JSON object) or (exit status,
    its error line) per text."""
    argv = [["generate", *(["--model", model] if model else []), "--prompt", text, "--json", "--greedy",
             "--max-new-tokens", str(new), "--threads", str(torch.get_num_threads()), *flags] for text in texts]
    out = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(argv), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the generate child process failed (exit status {out.returncode}): "
                           f"{out.stderr.strip()[-2000:]}")
    return [(code, r) for code, r in json.loads(out.stdout.strip().splitlines()[-1])]


def found(tok, tokens: list[int], key: int) -> bool:
    """Right: the key among the decoded new tokens (studies.passkey.run_passkey's rule)."""
    return str(key) in tok.decode(tokens)


def cases(tok, length: int, keys: int, seed: int = SEED) -> list[tuple[float, int, str]]:
    """(depth, key, prompt text) for every depth and `keys` keys each, the prompt at most `length`
    tokens; the same keys at every length for the same seed."""
    from llamablock.studies.passkey import DEPTHS, passkey_text

    rng = random.Random(seed)
    drawn = [(d, rng.randrange(10000, 100000)) for d in DEPTHS for _ in range(keys)]
    return [(d, key, passkey_text(tok, length, d, key)) for d, key in drawn]


def _cells(right: dict[float, list[bool]]) -> list[str]:
    per = [f"{sum(r)}/{len(r)}" if r else "" for r in right.values()]
    every = [x for r in right.values() for x in r]
    return per + [f"{sum(every)}/{len(every)} ({sum(every) / len(every):.2f})" if every else ""]


def measure(model: str | None = None, L: int | None = None, keys: int = KEYS, compare: tuple[str, ...] = COMPARE,
            compare_keys: int = COMPARE_KEYS) -> list[Section]:
    """The passkey table (accuracy per path and depth) and the answers, prompt by prompt. `L`: the
    context to double (default the model's own; a shorter one is named by --yarn-orig-ctx)."""
    from llamablock.io.loading import load_decoder
    from llamablock.io.source import open_source
    from llamablock.studies.context_extension import method_model
    from llamablock.studies.passkey import DEPTHS, NEW_TOKENS, greedy, passkey_prompt

    own = open_source(model)
    tok, trained = own.tokenizer, own.cfg.max_seq_len
    L = L or trained
    n = 2 * L
    yarn = ["--ctx-size", str(n), "--rope-scaling", "yarn"]
    if L != trained:  # a context taken shorter than the model's: name it and the factor
        yarn += ["--rope-scale", "2", "--yarn-orig-ctx", str(L)]
    # the prompt leaves room for the new tokens inside the context
    paths = {f"`generate {' '.join(yarn)}`": (n - NEW_TOKENS, yarn),
             "`generate`, unscaled, in its own context (L)": (L - NEW_TOKENS, [])}
    long = cases(tok, n - NEW_TOKENS, keys)
    answers: dict[str, list[list[int] | None]] = {}
    right = {name: {d: [] for d in DEPTHS} for name in [*paths, *(f"rope eval's scoring, {m}, float32" for m in compare)]}
    sizes, seconds, weights = {}, {}, {}
    for name, (length, flags) in paths.items():
        prompts = cases(tok, length, keys)
        answers[name], t0 = [], time.perf_counter()
        said = generate(model, [text for _, _, text in prompts], flags, NEW_TOKENS)
        for (d, key, _), (code, r) in zip(prompts, said, strict=True):
            if code != 0:
                raise RuntimeError(f"{name} failed: {r}")
            if r["prompt_ids"] != passkey_prompt(tok, length, d, key):
                raise RuntimeError(f"{name}: the command read other token ids than studies.passkey's prompt")
            answers[name].append(r["tokens"])
            right[name][d].append(found(tok, r["tokens"], key))
            sizes.setdefault(name, set()).add(len(r["prompt_ids"]))
            weights[name] = r["weights"]
        seconds[name] = (time.perf_counter() - t0) / len(prompts)
    base = load_decoder(own if L == trained else dataclasses.replace(own, cfg=own.cfg.replace(max_seq_len=L)),
                        torch.float32) if compare else None
    scored = [i for i, (d, _, _) in enumerate(long) if sum(1 for dd, _, _ in long[:i] if dd == d) < compare_keys]
    for m in compare:
        name = f"rope eval's scoring, {m}, float32"
        mm = method_model(base, m, 2.0, n)
        answers[name], t0 = [None] * len(long), time.perf_counter()
        for i in scored:
            d, key, text = long[i]
            ids = tok.encode(text)
            out = greedy(mm, ids, NEW_TOKENS, cached=True)
            answers[name][i] = out
            right[name][d].append(found(tok, out, key))
            sizes.setdefault(name, set()).add(len(ids))
        seconds[name] = (time.perf_counter() - t0) / max(1, len(scored))
        weights[name] = "float32 Decoder, RoPE " + ("unscaled past L" if m == "none" else f"{m} x2 (method_model)")

    depths = [f"{d:.0%} depth" for d in DEPTHS]
    acc = Section(f"Passkey retrieval, {own.path.name} (L = {L:,}{'' if L == trained else f', taken shorter than its {trained:,}'}), "
                  f"prompts of 2L = {n:,} tokens at most, greedy, {NEW_TOKENS} new tokens, {torch.get_num_threads()} thread(s)",
                  ["path", "prompt tokens", *depths, "all", "s per prompt", "weights"])
    for name, r in right.items():
        lo, hi = min(sizes[name]), max(sizes[name])
        acc.rows.append([name, f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}", *_cells(r), f"{seconds[name]:.0f}",
                         weights[name]])
    first = next(iter(paths))
    agree = [answers[first][i] == answers[f"rope eval's scoring, {m}, float32"][i] for m in compare if m == "yarn"
             for i in scored]
    if agree:
        acc.notes.append(f"yarn: the command's new tokens equal rope eval's scoring's on {sum(agree)} of {len(agree)} "
                         "prompts (the command runs the file's own precision, rope eval float32).")
    if L == trained:
        for flags in (["--ctx-size", str(n)], ["--ctx-size", str(n), "--rope-scaling", "none"]):
            [(code, said)] = generate(model, ["The"], flags, 1)
            acc.notes.append(f"`generate {' '.join(flags)}` (unscaled at 2L): " +
                             (f"refused, exit {code}: {said}" if code else "runs (not refused)"))
    acc.notes.append(f"Keys drawn from random.Random({SEED}), {keys} per depth; rope eval's scoring answers the first "
                     f"{compare_keys} per depth; `s per prompt` includes the command's model load (and its row's process "
                     "start).")
    each = Section("The answers, prompt by prompt (new tokens decoded; right when the key is in them)",
                   ["depth", "key", *right])
    for i, (d, key, _) in enumerate(long):
        cells = [f"{d:.0%}", str(key)]
        for name in right:
            a = answers[name][i]
            cells.append("" if a is None else f"{'right' if found(tok, a, key) else 'wrong'}: "
                         f"{json.dumps(tok.decode(a), ensure_ascii=False)}".replace("|", "\\|"))
        each.rows.append(cells)
    return [acc, each]


def run(quick: bool = False) -> list[Section]:
    if quick:
        return measure(L=256, keys=1, compare=("none", "yarn"), compare_keys=1)
    return measure()
