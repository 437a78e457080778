"""Decode and prefill tokens/s of SmolLM2-135M: llamablock in float32, bfloat16, q8 and q4
against transformers on the same GGUF, with the perplexity each format costs.

Models: llamablock.load_pretrained(None) (the embedded SmolLM2-135M-Instruct Q4_1 file,
dequantized to float32 by gguf's own kernels), its bfloat16 copy, and that copy quantized by
llamablock.fast.kernels.quant (q8 per row; q4 groups of 32 with an 8-bit head). transformers loads the same
file (`from_pretrained(dir, gguf_file=...)`, as benchmarks/decode.py does) and runs its default
DynamicCache with sdpa attention; both compute logits for the last position only (ours
`last_only`, transformers' `logits_to_keep=1`, as its generate does). llama.cpp (llama-cpp-python on the Q4_1 file, through
benchmarks/decode.py's helper) is measured only when installed; this project never installs it.
    decode   greedy steps at batch 1, timed in blocks of `steps` per implementation, the blocks
             alternating round by round (`_block_times`): every implementation sees the same context
             lengths (prompt + 1..steps) and the same drift in machine load
    prefill  one forward pass over the prompt with a fresh cache
    ceiling  copy bandwidth / weight bytes: a decode step reads every weight once
    ppl      perplexity on the Shakespeare validation split (llamablock.training.data), one window
    alone    the compiled q8 and q4 engines measured as llama.cpp is: each alone in a child
             process, best of 3 runs after a warm-up (the rounds above interleave ten runners
             in a process that holds every model; llama.cpp runs by itself)
A profile of the q8 decode step (torch.profiler, self CPU time by op) says where time goes;
benchmarks.decode_limits times the kernels that bound the missed targets.
--quick: a tiny random model (llama-2024-small), llamablock only, no perplexity.
"""

from __future__ import annotations

import copy
import json
import statistics
import time

import torch

from benchmarks import decode_limits
from benchmarks.common import Section, ms, run_child, verdict
from llamablock.fast.kernels.quant import quantize_model, weight_bytes
from llamablock.kv_cache import KVCache
from llamablock.util.timing import time_calls

NAME = "decode"
CLAIM = "decode at batch 1: float32/bfloat16 >= 3x transformers; q8 >= 1.75x and q4 >= 1.5x llama.cpp"


class _Ours:
    def __init__(self, model, dtype, n_prompt, steps):
        self.model, self.dtype, self.n, self.steps = model, dtype, n_prompt, steps

    def prefill(self, ids):
        cache = KVCache(self.model.cfg, 1, ids.shape[1] + self.steps + 8, dtype=self.dtype)
        logits = self.model(ids, cache=cache, last_only=True)[:, -1]
        return logits, cache

    def start(self, ids):
        self.logits, self.cache = self.prefill(ids)

    def step(self):
        self.logits = self.model(self.logits.argmax(-1, keepdim=True), cache=self.cache)[:, -1]


class _HF:
    def __init__(self, model, steps):
        self.model, self.steps = model, steps

    def prefill(self, ids):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1], cache

    def start(self, ids):
        self.logits, self.cache = self.prefill(ids)
        self.pos = ids.shape[1]

    def step(self):
        tok = self.logits.argmax(-1, keepdim=True)
        out = self.model(input_ids=tok, cache=self.cache, use_cache=True,
                         position_ids=torch.tensor([[self.pos]]), cache_position=torch.tensor([self.pos]), logits_to_keep=1)
        self.logits, self.pos = out.logits[:, -1], self.pos + 1


def _models(quick: bool):
    """name -> (llamablock model or None, dtype, transformers model or None), plus token ids."""
    import llamablock
    from llamablock.model import Decoder
    from llamablock.presets import preset

    if quick:
        base = Decoder(preset("llama-2024-small")).eval()
        ids = torch.randint(0, base.cfg.vocab_size, (1, 32))
        hf = {}
        val_ids = None
    else:
        import transformers

        from llamablock.io.gguf import open_gguf
        from llamablock.io.resolve import resolve_model
        from llamablock.io.tokenizer import tokenizer_from_gguf
        from llamablock.training.data import load_split

        path = resolve_model(None)
        tok = tokenizer_from_gguf(open_gguf(path))
        val_ids = tok.encode(load_split().val[:20000])
        ids = torch.tensor([val_ids[:512]])
        base = llamablock.load_pretrained(None).eval()
        hf32 = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                 dtype=torch.float32).eval()
        hf = {"float32": hf32, "bfloat16": copy.deepcopy(hf32).to(torch.bfloat16)}
    bf = copy.deepcopy(base).to(torch.bfloat16)
    ours = {"float32": (base, torch.float32), "bfloat16": (bf, torch.bfloat16),
            "q8": (quantize_model(copy.deepcopy(bf), "q8"), torch.bfloat16),
            "q4": (quantize_model(copy.deepcopy(bf), "q4"), torch.bfloat16)}
    return ours, hf, ids, val_ids


class _Compiled:
    """A compiled engine of llamablock.fast.compiled.static_engine: the static layout, its step compiled."""

    def __init__(self, model, fmt: str, steps: int, autotune: bool, backend: str = "aoti", compile_prefill: bool = True,
                 **inductor):
        from llamablock.fast.compiled.aoti_engine import AOTIEngine
        from llamablock.fast.compiled.inductor_engine import InductorEngine

        if backend == "inductor":
            self.engine = InductorEngine(model, fmt, autotune=autotune, inductor=inductor)
        else:
            self.engine = AOTIEngine(model, fmt, autotune=autotune, inductor=inductor, compile_prefill=compile_prefill)
        self.steps = steps

    def prefill(self, ids):
        return self.engine.prefill(ids)

    def start(self, ids):
        self.logits, self.pos = self.engine.prefill(ids), ids.shape[1]

    def step(self):
        self.logits = self.engine.step(self.logits.argmax(-1, keepdim=True), self.pos)
        self.pos += 1


def _add_compiled(runners: dict, ours: dict, prompt, steps: int, quick: bool) -> list[str]:
    """Add 'llamablock <fmt> compiled' runners (all four formats; --quick: float32 without
    autotuning, its prefill eager: compiling it would add a minute to the test suite, whose own
    tests check the compiled prefill); check each against its eager twin; return their names."""
    out = []
    for fmt in ("float32",) if quick else ("float32", "bfloat16", "q8", "q4"):
        base = ours["float32" if fmt == "float32" else "bfloat16"][0]  # the float model: it fuses, then quantizes
        r = _Compiled(base, fmt, steps, autotune=not quick, compile_prefill=not quick)
        r.engine.prepare(prompt.shape[1] + steps + 8)
        out.append(f"llamablock {fmt} compiled")
        r.start(prompt)
        ref = runners[f"llamablock {fmt}"]
        ref.start(prompt)
        for i in range(4):  # the prefill's logits, then three steps
            # bfloat16 over 30 layers: a reordered sum moves logits by a few bf16 ulps (0.125 at 16-32),
            # so the check is relative to the logit scale, as the model test in tests/fast/kernels/test_quant.py.
            diff = (r.logits.float() - ref.logits.float()).abs().max()
            if diff > 2**-4 * ref.logits.float().abs().max():
                where = f"step {i}" if i else "prefill"
                raise AssertionError(f"compiled {fmt} differs from eager by {diff:.3f} ({where})")
            # both continue with the eager model's token: at a near-tie, a few ulps may pick another
            # token, after which the two would compute different things
            r.logits = ref.logits.clone()
            r.step()
            ref.step()
        runners[f"llamablock {fmt} compiled"] = r
    return out


def _profiled_steps(runner, steps: int, title: str, first: str, rows: int) -> tuple[Section, list, float]:
    """torch.profiler over `steps` decode steps: a table of the top `rows` events by self CPU time,
    the events (sorted) and their total self time in microseconds."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            runner.step()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    sec = Section(title, [first, "calls per step", "self ms per step", "share"])
    for e in events[:rows]:
        sec.rows.append([e.key[:70], f"{e.count / steps:.0f}", ms(e.self_cpu_time_total / 1e6 / steps),
                         f"{100 * e.self_cpu_time_total / total:.1f}%"])
    return sec, events, total


def _profile(runner, bandwidth: float, steps: int = 5) -> Section:
    sec, events, total = _profiled_steps(runner, steps, f"Profile of {steps} q8 decode steps (torch.profiler, "
                                         "self CPU time)", "op", 10)
    mm = sum(e.self_cpu_time_total for e in events if "pack_mm" in e.key or e.key in ("aten::mm", "aten::bmm"))
    wb = weight_bytes(runner.model)
    mm_s, rest_s = mm / 1e6 / steps, (total - mm) / 1e6 / steps
    sec.notes.append(f"Matmul kernels (packed int8/int4, mm, bmm): {100 * mm / total:.0f}% of self time, "
                     f"{mm_s * 1e3:.1f} ms per step, reading {wb / 2**20:.0f} MiB of weights at {wb / mm_s / 1e9:.1f} GB/s "
                     f"(copy bandwidth in this run: {bandwidth / 1e9:.1f} GB/s read + write). The other "
                     f"{rest_s * 1e3:.1f} ms per step are {sum(e.count for e in events) / steps:.0f} op launches "
                     "(eager PyTorch, one Python call each): what the compiled step removes.")
    return sec


def _compiled_profile(bf16_model, prompt, steps: int = 10) -> Section:
    """The compiled q8 step by kernel: inductor built with kernel profiling (a separate compile)."""
    r = _Compiled(bf16_model, "q8", steps, autotune=True, backend="inductor", **{"cpp.enable_kernel_profile": True})
    r.start(prompt)
    r.step()
    sec, events, total = _profiled_steps(r, steps, f"Profile of {steps} q8 decode steps compiled by torch.compile "
                                         "(inductor kernel profile, self CPU time)", "kernel or op", 8)
    sec.notes.append("`graph_N_kernel` rows are the int8 weight matmuls (C++ GEMM templates, one call per linear layer); "
                     "`Call CompiledFxGraph` is the Python wrapper that launches the kernels; attention over the "
                     "cache is in the fused `cpp_fused_..._softmax_...` kernels. The 'compiled' rows of the table above run the same "
                     "kernels from an AOTInductor package, whose C++ launcher has no Python wrapper and no guards.")
    per_step = {"total": total / 1e6 / steps,
                "gemm": sum(e.self_cpu_time_total for e in events if e.key.endswith("_kernel") and "gemm_m" not in e.key) / 1e6 / steps,
                "launch": sum(e.self_cpu_time_total for e in events if "CompiledFxGraph" in e.key or "Dynamo" in e.key) / 1e6 / steps,
                "kernels": sum(e.self_cpu_time_total for e in events if e.key.startswith("graph_")) / 1e6 / steps}
    return sec, per_step


def _limits(sec: Section, dec: dict, pre: dict, prefill_tokens: int, bw: float, runners: dict, cpp_rate: float | None,
            per_step: dict, parts: dict) -> None:
    """Notes that say what limits the missed targets, from this run's numbers, the kernel profile
    and benchmarks.decode_limits' measurements (`parts`: q8_bytes, stream, gemv_s, gemm_s, attn_s; q8_alone,
    the q8 engine's tokens/s alone in a child)."""
    for fmt in ("float32", "bfloat16"):
        need = 3.0 / dec[f"transformers {fmt}"]["median"]  # tokens/s that 3x transformers means
        wb = weight_bytes(runners[f"llamablock {fmt}"].model)
        ceiling, streamed = bw / wb, parts["stream"] / wb  # copy bandwidth; MKL's float32 GEMV read rate
        got = 1 / dec[f"llamablock {fmt} compiled"]["median"]
        gemvs = (f" The step's weight matrix-vector products alone, through MKL, in 2 MiB pages as the step's weights "
                 f"are, take {1e3 * parts['gemv_s']:.1f} ms "
                 f"of its {1e3 / got:.1f} ms (table 'One float32 decode step's ... products' below)."
                 if fmt == "float32" else "")
        sec.notes.append(f"Limit, {fmt}: 3x transformers is {need:.0f} tok/s; reading the weights once per token at "
                         f"this run's copy bandwidth allows {ceiling:.0f} tok/s ({streamed:.0f} at the rate MKL's float32 "
                         f"matrix-vector product streams a {decode_limits.STREAM_MIB} MiB matrix), and the compiled step reaches {got:.0f} "
                         f"({100 * got / ceiling:.0f}% of the first)." + (" The target is above both: no implementation "
                         "that reads the weights can meet it on this machine." if need > max(ceiling, streamed) else "")
                         + gemvs)
    need_s = pre["transformers float32"]["median"] / 1.5
    got_s = pre["llamablock float32 compiled"]["median"]
    sec.notes.append(f"Limit, float32 prefill: 1.5x transformers is {1e3 * need_s:.0f} ms for {prefill_tokens} tokens; "
                     f"the compiled prefill takes {1e3 * got_s:.0f}. Timed on their own with the kernels transformers "
                     f"calls (table 'Parts of a {prefill_tokens}-token float32 prefill' below: F.linear, i.e. MKL, and "
                     f"PyTorch's flash attention), its weight GEMMs take {1e3 * parts['gemm_s']:.0f} ms and causal "
                     f"attention {1e3 * parts['attn_s']:.0f} ms, {100 * (parts['gemm_s'] + parts['attn_s']) / need_s:.0f}% "
                     "of the target's time. Compiling fuses the element-wise rest and lets inductor's GEMM templates "
                     "replace MKL where they win its autotuning. The bfloat16 compiled prefill, whose GEMMs may use "
                     "AMX, ran at "
                     f"{pre['transformers bfloat16']['median'] / pre['llamablock bfloat16 compiled']['median']:.2f}x "
                     "transformers in this run.")
    if cpp_rate is None:  # the q8 limit is stated against a llama.cpp measured in this run only
        return
    need_ms = 1e3 / (1.75 * cpp_rate)
    gemm_ms = 1e3 * per_step["gemm"]
    stream_ms = 1e3 * parts["q8_bytes"] / parts["stream"]
    rest_ms = 1e3 * (per_step["kernels"] - per_step["gemm"])  # the graph's other kernels: attention, norms, element-wise
    step_ms = 1e3 * dec["llamablock q8 compiled"]["median"]
    sec.notes.append(f"Limit, q8: 1.75x llama.cpp is {1.75 * cpp_rate:.0f} tok/s, {need_ms:.1f} ms per step; the compiled "
                     f"step above takes {step_ms:.1f} ms in the interleaved rounds and {1e3 / parts['q8_alone']:.1f} ms "
                     "alone (measured as llama.cpp is). In the kernel profile below (the same kernels built by "
                     "torch.compile, its weights left in 4 KiB pages: llamablock.fast.compiled.huge_pages moves only the "
                     f"AOTInductor program's), the step's int8 matmuls alone take {gemm_ms:.1f} ms per step "
                     f"({parts['q8_bytes'] / per_step['gemm'] / 1e9:.0f} GB/s over {parts['q8_bytes'] / 2**20:.0f} MiB of "
                     f"int8 weights) and its other kernels {rest_ms:.1f} ms; streaming those bytes at the rate a float32 "
                     f"matrix-vector product reads a {decode_limits.STREAM_MIB} MiB matrix ({parts['stream'] / 1e9:.1f} GB/s) "
                     f"would take {stream_ms:.1f} ms. PyTorch's int8 kernels called one by one are slower still at one row "
                     "(table 'One q8 decode step's ... matmuls' below). The step is bound by the rate its int8 matmuls "
                     "stream their weights" + (f"; even at the float32 rate, weights and other kernels would take "
                     f"{stream_ms + rest_ms:.1f} ms, above the target's {need_ms:.1f}." if stream_ms + rest_ms > need_ms
                     else "."))


_ALONE_CHILD = r"""
import json, sys, time, torch
from llamablock.fast.compiled.compile_cache import use_persistent_cache
from llamablock.fast.kernels.malloc import tune_allocator
tune_allocator(); use_persistent_cache()
import llamablock
from llamablock.fast.compiled.aoti_engine import AOTIEngine
fmt, ids, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
engine = AOTIEngine(llamablock.load_pretrained(None, torch.bfloat16), fmt)
engine.prepare(len(ids) + new + 1)
prompt = torch.tensor([ids])
@torch.no_grad()
def run():
    logits = engine.prefill(prompt)
    t = time.perf_counter()
    for i in range(new):
        logits = engine.step(logits.argmax(-1, keepdim=True), len(ids) + i)
    return time.perf_counter() - t
run()  # warm-up
print(json.dumps(new / min(run() for _ in range(3))))
"""


def _alone_speed(fmt: str, ids: list[int], new: int) -> float:
    """Decode tokens/s of the compiled `fmt` engine measured as llama.cpp is (benchmarks.decode's
    child): alone in a child process, `new` greedy steps after `ids`, best of 3 after a warm-up. The
    child uses the parent's compile cache (the packages the decode rows loaded or compiled)."""
    return run_child(_ALONE_CHILD, fmt, json.dumps(ids), str(new))


def _block_times(runners: dict, prompt, steps: int, rounds: int) -> dict:
    """Seconds per decode step, min and median over rounds. In each round every runner prefills the
    prompt and decodes `steps` tokens in one block, as a real generation does, so its weights stay as
    warm in the CPU caches as they would for a user (step-by-step interleaving evicted them: SmolLM2 in
    q8 is 183 MiB and would otherwise stay in this machine's L3); the blocks alternate between runners
    round by round, so all of them see the same drift in load."""
    samples = {k: [] for k in runners}
    for _ in range(rounds):
        for k, r in runners.items():
            r.start(prompt)
            r.step()  # the first step after a prefill, outside the clock
            t = time.perf_counter()
            for _ in range(steps):
                r.step()
            samples[k].append((time.perf_counter() - t) / steps)
    return {k: {"min": min(v), "median": statistics.median(v)} for k, v in samples.items()}


@torch.no_grad()
def run(quick: bool = False) -> list[Section]:
    from benchmarks.decode import copy_bandwidth, llamacpp_speed

    ours, hf, ids, val_ids = _models(quick)
    steps = 8 if quick else 48
    prompt = ids[:, :32 if quick else 64]
    runners = {f"llamablock {k}": _Ours(m, dt, prompt.shape[1], steps + 4) for k, (m, dt) in ours.items()}
    runners.update({f"transformers {k}": _HF(m, steps + 4) for k, m in hf.items()})
    compiled = _add_compiled(runners, ours, prompt, steps, quick)
    rounds = 2 if quick else 3
    dec = _block_times(runners, prompt, steps, rounds)
    pre = time_calls({k: (lambda r=r: r.prefill(ids)) for k, r in runners.items()},
                     repeats=2 if quick else 3, warmup=1)
    bw = copy_bandwidth()
    ppl = {}
    if val_ids is not None:
        from llamablock.runtime.evaluate import sliding_perplexity

        for k, (m, _) in ours.items():
            ppl[k] = sliding_perplexity(m, val_ids[:512], context=512, stride=512)[0]
    sec = Section(f"Decode and prefill, batch 1, prompt {prompt.shape[1]} tokens then {steps} steps (median and best "
                  f"of {rounds} rounds); prefill "
                  f"{ids.shape[1]} tokens", ["implementation", "weights MiB", "decode tok/s (median)", "decode tok/s (best)",
                                              "x transformers", "ceiling tok/s", "prefill tok/s", "prefill x transformers",
                                              "ppl", "ppl vs float32"])
    for k in runners:
        fmt = k.split()[1]
        wb = weight_bytes(runners[k.removesuffix(" compiled")].model)  # the compiled twin reads the same weights
        d = 1 / dec[k]["median"]
        p = f"{ids.shape[1] / pre[k]['median']:.0f}"
        ref = f"transformers {'bfloat16' if fmt in ('q8', 'q4') else fmt}"
        dx = f"{dec[ref]['median'] / dec[k]['median']:.2f}x" if ref in dec else ""
        px = f"{pre[ref]['median'] / pre[k]['median']:.2f}x" if ref in pre else ""
        pp = f"{ppl[fmt]:.3f}" if k.startswith("llamablock") and fmt in ppl and "compiled" not in k else ""
        pr = f"{100 * (ppl[fmt] / ppl['float32'] - 1):+.2f}%" if pp else ""
        sec.rows.append([k, f"{wb / 2**20:.0f}", f"{d:.1f}", f"{1 / dec[k]['min']:.1f}", dx, f"{bw / wb:.0f}",
                         p, px, pp, pr])
    from llamablock.fast.compiled.static_engine import PREFILL_MIN

    for k in compiled:  # compile seconds read after the prefill timing: it may have compiled a longer cache
        secs, compiled_prefill = runners[k].engine.compile_seconds, runners[k].engine.compile_prefill
        gemm = "" if quick else (", its step's GEMVs MKL's (step_options)" if "float32" in k else
                                 " and the C++ GEMM templates (step_options)")
        prefill = (f"is compiled too (one program for every prompt length; prompts under {PREFILL_MIN} tokens padded)"
                   if compiled_prefill else "is the static layout's, eager")
        sec.notes.append(f"{k}: llamablock.fast.compiled.static_engine (fused weights, static cache, compiled ahead of time by "
                         f"AOTInductor with freezing{gemm}); its prefill "
                         f"{prefill}. Compiling took {secs:.0f} s in all (each program at "
                         "each cache length this run used: the prefill's may be longer than the decode rows'), not "
                         "in the timings (0 when the packages were already on disk: see compile_cache).")
    sec.notes.append(f"Copy bandwidth {bw / 1e9:.1f} GB/s (read + write of 256 MiB) in this run; q8/q4 are "
                     "compared with transformers in bfloat16, their activation dtype.")
    if not quick:
        from llamablock.io.resolve import resolve_model

        for fmt in ("float32", "bfloat16"):
            for variant in (f"llamablock {fmt}", f"llamablock {fmt} compiled"):
                x = dec[f"transformers {fmt}"]["median"] / dec[variant]["median"]
                sec.notes.append(verdict(f"{variant} decode vs transformers {fmt}", x, 3.0))
                x = pre[f"transformers {fmt}"]["median"] / pre[variant]["median"]
                sec.notes.append(verdict(f"{variant} prefill of {ids.shape[1]} tokens vs transformers", x, 1.5))
        path = resolve_model(None)
        cpp = llamacpp_speed(path, prompt[0].tolist(), steps, torch.get_num_threads(), ids[0].tolist())
        if cpp is None or isinstance(cpp, str):
            why = "not installed here" if cpp is None else cpp
            cpp_rate, src = None, None  # no figure from elsewhere stands in for a measurement of this run
            sec.notes.append(f"llama.cpp was not measured in this run ({why}): the targets against it are not judged.")
        else:
            cpp_rate, src = cpp[1], f"llama.cpp measured in this run on {path.name} ({cpp[1]:.1f} tok/s)"
            wb = path.stat().st_size
            sec.rows.append([f"llama.cpp ({path.name.split('.')[-2]} file)", f"{wb / 2**20:.0f}", f"{cpp[1]:.1f}", "", "",
                             f"{bw / wb:.0f}", f"{cpp[0]:.0f}", "", "", ""])
            sec.notes.append("llama.cpp (llama-cpp-python, installed by hand; this project never installs it) ran in a "
                             "child process after the others, not interleaved: best of 3 runs after a warm-up, the same "
                             "prompt and steps, greedy; its 'weights MiB' is the file's size.")
        alone = {fmt: _alone_speed(fmt, prompt[0].tolist(), steps) for fmt in ("q8", "q4")}
        for fmt, rate in alone.items():
            sec.rows.append([f"llamablock {fmt} compiled, alone", "", f"{rate:.1f}", "", "", "", "", "", "", ""])
        sec.notes.append("'llamablock q8/q4 compiled, alone': the same engines measured as llama.cpp is, each alone in "
                         "a child process after the others: best of 3 runs after a warm-up, the same prompt and steps.")
        for fmt, target, ppl_target in (("q8", 1.75, 3.0), ("q4", 1.5, 1.0)):
            for variant in (f"llamablock {fmt}", f"llamablock {fmt} compiled") if cpp_rate else ():
                rate = 1 / dec[variant]["median"]
                sec.notes.append(verdict(f"{variant} decode vs {src}", rate / cpp_rate, target))
            if cpp_rate:
                sec.notes.append(verdict(f"llamablock {fmt} compiled, alone as llama.cpp runs, vs {src}",
                                         alone[fmt] / cpp_rate, target))
            rel = 100 * abs(ppl[fmt] / ppl["float32"] - 1)
            sec.notes.append(verdict(f"{fmt} perplexity change vs float32", rel, ppl_target, higher_is_better=False, unit="%"))
    sections = [sec, _profile(runners["llamablock q8"], bw)]
    if not quick:
        profile, per_step = _compiled_profile(ours["bfloat16"][0], prompt)
        gemv, q8_bytes, stream = decode_limits.int8_kernels(runners["llamablock q8 compiled"].engine.static)
        f32_static = runners["llamablock float32 compiled"].engine.static
        gemvs_sec, gemv_s = decode_limits.float32_gemvs(f32_static)
        parts_sec, gemm_s, attn_s = decode_limits.prefill_parts(f32_static, ids.shape[1])
        _limits(sec, dec, pre, ids.shape[1], bw, runners, cpp_rate, per_step,
                {"q8_bytes": q8_bytes, "stream": stream, "gemv_s": gemv_s, "gemm_s": gemm_s, "attn_s": attn_s,
                 "q8_alone": alone["q8"]})
        sections += [profile, gemv, gemvs_sec, parts_sec]
    return sections
