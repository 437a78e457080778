"""What would close each target `bench size` misses, computed from the same run's numbers.

A missed target comes with its measured reason and what would close it. The reason is the eager
step's profile (benchmarks/step_profile.py: block kernel, attention, the rest); this module
turns a miss and that profile into the change that would meet it, under one stated assumption:
the parts not named keep their time. For a rate short of its target by a factor r (measured /
target), the step must take r of its profiled time; taking the attention and the rest as they
are, the block kernel's share of that is what is left, and the kernel must run k / (that) times
faster. Where what is left is not positive, no kernel meets the target and the rest of the step
must shrink first. The profile is the eager engine's, in the benchmark's own process; the
compiled engine's step is one program with no parts to time, so its misses are not decomposed
here.
"""

from __future__ import annotations


def rate_gap(what: str, ratio: float, target: float, prof: dict) -> str | None:
    """One sentence for a rate (decode or prefill) at `ratio` of llama.cpp against `target`, from
    the profile of that phase ({'step', 'kernel', 'attention', 'rest'} in seconds); None when met."""
    if ratio >= target:
        return None
    step, kernel = prof["step"], prof["kernel"]
    other = step - kernel
    allowed = step * ratio / target  # the step's time at the target, scaled to the profiled step
    left = allowed - other
    if left <= 0:
        return (f"{what}: at the target the step would take {allowed * 1e3:.1f} ms, less than its attention and "
                f"the rest take now ({other * 1e3:.1f} ms): no block kernel closes it; the per-layer work outside "
                "the kernel must shrink first (what the compiled engine removes).")
    return (f"{what}: the block kernel {kernel / left:.2f}x faster ({kernel * 1e3:.1f} -> {left * 1e3:.1f} ms "
            f"of a {step * 1e3:.1f} ms step), attention and the rest as they are, would meet it.")


def bandwidth_gap(what: str, share: float, target: float, prof: dict, step_bytes: int, read_rate: float) -> str | None:
    """The decode step's bandwidth share against `target`: how fast the block kernel alone reads the
    weights (bytes / its time, over the plain read's rate), and what the step would need."""
    if share >= target:
        return None
    alone = step_bytes / prof["kernel"] / read_rate
    need = step_bytes / (target * read_rate)  # the whole step's time at the target
    other = (prof["step"] - prof["kernel"]) * 1e3
    head = (f"{what}: the block kernel alone streams {alone:.0%} of the plain read ({step_bytes / 2**20:.0f} MiB "
            f"in {prof['kernel'] * 1e3:.1f} ms); at {target:.0%} the whole step takes {need * 1e3:.1f} ms")
    if alone >= target:
        return f"{head}: the kernel is fast enough, the other {other:.1f} ms must overlap it or go."
    return f"{head}, so the kernel must read at least that fast and the other {other:.1f} ms must overlap it or go."


def memory_gap(what: str, whole: float, beyond_floor: float, target: float, floor_mib: float) -> str | None:
    """The peak / (file + KV) of the whole process against `target`, beside the same without the
    interpreter's floor (python + torch + the command line imported)."""
    if whole <= target:
        return None
    if beyond_floor <= target:
        return (f"{what}: without the {floor_mib:.0f} MiB of python + torch + the command line the peak is "
                f"{beyond_floor:.2f}x, within {target:g}x: the miss is the runtime's floor, not the weights or "
                "the cache (closing it means a process without torch's import).")
    return (f"{what}: {beyond_floor:.2f}x even without the interpreter's {floor_mib:.0f} MiB: copies beyond the "
            "file and the cache remain.")
