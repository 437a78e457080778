"""Section 15.1: RoPE makes the score depend only on the gap m - n (module lab 4a).

Every rotation here goes through the library's `Rotary` (rope_cos_sin and apply_rope; float32, the
module's neighbouring-pair layout), so the lab measures the code the models run: a RoPE whose
angle were not linear in the position would fail every claim below but the frequency ratio.
"""

from __future__ import annotations

import numpy as np
import torch

from llamablock.lab.details_text import said
from llamablock.lab.record import Claim
from llamablock.lab.shared import QUICK, trained_2017
from llamablock.positions import LearnedPositions
from llamablock.rope import Rotary
from llamablock.rope_scaling import RopeSpec, default_inv_freq

# The ids of the claims this experiment records (for `llamablock lab --only`).
CLAIMS = (
    "15.1.rotation-identity",
    "15.1.rope-2d-offset",
    "15.1.rope-head-offset",
    "15.1.learned-table-shift",
    "15.1.learned-table-no-entry",
    "15.1.frequency-ratio",
    "15.1.shift-both",
)

# The module's figures (section 15.1, "Measured" boxes of lab 4a).
MODULE_PAIR_SPREAD, MODULE_HEAD_SPREAD, MODULE_LEARNED_SHIFT = 4.77e-7, 1e-5, 5.78


def _head(head_dim: int, base: float = 10000.0) -> Rotary:
    """RoPE for one head of width `head_dim`, in the module's neighbouring-pair layout."""
    return Rotary(RopeSpec(base, head_dim, 2048), "interleaved")


def rotate_at(rotary: Rotary, x: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """x (t, d) with row j rotated to positions[j], through the library's rotation."""
    cos, sin = rotary.cos_sin(torch.tensor([positions]), torch.float32)
    return rotary.rotate(x[None, None], cos, sin)[0, 0]


def rotated_score(rotary: Rotary, q: torch.Tensor, k: torch.Tensor, m: int, n: int) -> float:
    """<R_m q, R_n k> in float32, through the library's rotation."""
    r = rotate_at(rotary, torch.stack([q, k]), [m, n])
    return float(r[0] @ r[1])


def offset_spread(rotary: Rotary, offsets, starts, seeds: int = 5) -> dict[int, float]:
    """Largest change of the score at a fixed offset as both tokens slide over `starts`."""
    d = rotary.spec.rotary_dim
    out = {}
    for off in offsets:
        worst = 0.0
        for seed in range(seeds):
            g = torch.Generator().manual_seed(seed)
            q, k = torch.randn(d, generator=g), torch.randn(d, generator=g)
            s = [rotated_score(rotary, q, k, n + off, n) for n in starts]
            worst = max(worst, max(s) - min(s))
        out[off] = worst
    return out


def claim_identity() -> Claim:
    """The library's R(m), read off by rotating the unit vectors, against R(n - m)."""
    c = Claim("15.1.rotation-identity", "15.1", "R(m)^T R(n) = R(n - m): only the gap survives", "exact",
              unit="max |entry difference|, float32", tolerance="float32 rounding of angles up to 200 rad: below 1e-4")
    rope = _head(2)  # one pair, theta = 1 rad per token

    def matrix(m: int) -> torch.Tensor:  # columns: the rotated unit vectors
        return rotate_at(rope, torch.eye(2), [m, m]).T.double()

    worst = max(float((matrix(m).T @ matrix(n) - matrix(n - m)).abs().max())
                for m in range(0, 200, 13) for n in range(m, 200, 17))
    c.measured = worst
    return c.judge(worst < 1e-4, said("15.1.rotation-identity", worst=worst))


def claim_2d_pair(quick: bool) -> Claim:
    c = Claim("15.1.rope-2d-offset", "15.1", "one 2D pair: score at a fixed offset constant across positions",
              MODULE_PAIR_SPREAD, unit="max spread of the score", tolerance="float32 rounding: below 1e-5")
    rope = _head(2)  # one pair, theta = 1 rad per token
    starts = list(range(0, 200 if quick else 1000, 7))
    draws, offsets = 3 if quick else 10, [0, 1, 7, 63, 200]
    spread = offset_spread(rope, offsets, starts, seeds=draws)
    c.measured = max(spread.values())
    return c.judge(c.measured < 1e-5, said("15.1.rope-2d-offset", draws=draws, first=starts[0], last=starts[-1],
                                           offsets=offsets, spread=spread, eps=float(torch.finfo(torch.float32).eps)))


def score64(q: torch.Tensor, k: torch.Tensor, m: int, n: int, base: float = 10000.0) -> float:
    """<R_m q, R_n k> evaluated independently of the library in float64 (numpy): neighbouring pairs
    (x[2i], x[2i+1]) turned by position x base^(-2i/d), as the module writes theta_i."""
    q64, k64 = q.double().numpy(), k.double().numpy()
    theta = base ** (-np.arange(0, q64.size, 2) / q64.size)

    def turn(x, pos):
        c, s = np.cos(pos * theta), np.sin(pos * theta)
        return np.stack([x[0::2] * c - x[1::2] * s, x[0::2] * s + x[1::2] * c], axis=-1).ravel()

    return float(turn(q64, m) @ turn(k64, n))


def rounding_bound(q: torch.Tensor, k: torch.Tensor, m: int, n: int, dtype: torch.dtype = torch.float32,
                   base: float = 10000.0) -> float:
    """A first-order bound on |score computed in `dtype` - exact score| for RoPE at positions m, n, from
    the dtype's epsilon (2^-23 for float32: twice the unit roundoff, a factor 2 of margin): each angle p x theta_i is
    rounded by at most eps x p x theta_i (theta_i and the product each rounded), cos and sin add about
    eps each, the rotation's multiply-adds 2 eps, and the d-term dot product eps x d (Higham's bound
    for a sum of d products), every error scaled by the pair's |q_i| |k_i|."""
    eps = float(torch.finfo(dtype).eps)
    d = q.numel()
    theta = base ** (-np.arange(0, d, 2) / d)
    ab = (q.double().view(-1, 2).norm(dim=1) * k.double().view(-1, 2).norm(dim=1)).numpy()
    return float(eps * (ab * (abs(m) * theta + abs(n) * theta + 4 + d)).sum())


# Offsets and sliding starts of the head check; the same starts 500 tokens later (the module's "move
# a passage 500 tokens later"); and starts that end at position 20,000.
HEAD_OFFSETS = (0, 1, 7, 63, 200)
HEAD_STARTS = tuple(range(0, 300, 11))
SHIFT = 500
FAR_STARTS = tuple(range(19_800 - 297, 19_801, 11))  # with offsets up to 200: positions to 20,000


def claim_head(quick: bool) -> Claim:
    """A 32-dim head, base 10000, through the library's RoPE in float32 against a float64 evaluation
    of the same rotation: every score within the float32 bound derived from epsilon and the angle's
    size (`rounding_bound`), at positions 0..500, the same pairs moved 500 tokens later, and positions
    near 20,000; the float64 scores at a fixed offset agree to float64 rounding (the identity itself).
    The moved pair's float32 scores then differ by at most the two bounds together."""
    c = Claim("15.1.rope-head-offset", "15.1", "32-dim head, base 10000: score depends only on the offset",
              MODULE_HEAD_SPREAD, unit="spread of the float32 score at a fixed offset, positions 0..1,000",
              tolerance="every float32 score within its epsilon-derived bound of float64; a 500-token move "
                        "within the two bounds; positions to 20,000")
    rope = _head(32)
    worst_ratio, worst_move, spread_near, spread64, far_err = 0.0, 0.0, 0.0, 0.0, 0.0
    draws = 3 if quick else 10
    for seed in range(draws):
        g = torch.Generator().manual_seed(seed)
        q, k = torch.randn(32, generator=g), torch.randn(32, generator=g)
        for off in HEAD_OFFSETS:
            near, exact, bound64 = [], [], 0.0
            for n in HEAD_STARTS + tuple(x + SHIFT for x in HEAD_STARTS) + FAR_STARTS:
                s32, s64 = rotated_score(rope, q, k, n + off, n), score64(q, k, n + off, n)
                worst_ratio = max(worst_ratio, abs(s32 - s64) / rounding_bound(q, k, n + off, n))
                if n >= FAR_STARTS[0]:
                    far_err = max(far_err, abs(s32 - s64))
                else:
                    near.append(s32)
                exact.append(s64)
                bound64 = max(bound64, rounding_bound(q, k, n + off, n, torch.float64))
                if n < SHIFT:  # the same pair 500 tokens later, against both bounds
                    moved = rotated_score(rope, q, k, n + off + SHIFT, n + SHIFT)
                    worst_move = max(worst_move, abs(moved - s32) / (rounding_bound(q, k, n + off, n)
                                                                     + rounding_bound(q, k, n + off + SHIFT, n + SHIFT)))
            spread_near = max(spread_near, max(near) - min(near))
            spread64 = max(spread64, (max(exact) - min(exact)) / (2 * bound64))
    c.measured = spread_near
    ok = worst_ratio <= 1 and worst_move <= 1 and spread64 <= 1
    return c.judge(ok, said("15.1.rope-head-offset", draws=draws, offsets=list(HEAD_OFFSETS), first=HEAD_STARTS[0],
                            last=HEAD_STARTS[-1], shift=SHIFT, far_first=FAR_STARTS[0], far_last=FAR_STARTS[-1],
                            far_top=FAR_STARTS[-1] + max(HEAD_OFFSETS), worst_ratio=worst_ratio, far_err=far_err,
                            worst_move=worst_move, spread64=spread64, near_top=HEAD_STARTS[-1] + SHIFT + max(HEAD_OFFSETS),
                            spread_near=spread_near))


def _trained_scores(state: dict, cfg):
    """(learned(a, b, m, n), rope(a, b, m, n)): head 0 of the trained 2017 model's first attention
    layer scoring token a at position m against token b at n, scaled by 1 / sqrt(head width); learned
    adds the table's rows to the embeddings as that layer reads them, rope rotates the same projected
    embeddings instead."""
    table, emb, hd = state["positions.table.weight"], state["embed.weight"], cfg.head_dim  # (rows, D), (V, D)
    wq, wk = state["layers.0.attn.wq.weight"][:hd], state["layers.0.attn.wk.weight"][:hd]  # head 0: (hd, D)
    bq = state.get("layers.0.attn.wq.bias", torch.zeros(cfg.n_heads * hd))[:hd]
    bk = state.get("layers.0.attn.wk.bias", torch.zeros(cfg.n_kv_heads * hd))[:hd]
    rope = _head(hd)

    def learned(a: int, b: int, m: int, n: int) -> float:
        return float((wq @ (emb[a] + table[m]) + bq) @ (wk @ (emb[b] + table[n]) + bk)) / hd ** 0.5

    def rotated(a: int, b: int, m: int, n: int) -> float:
        return rotated_score(rope, wq @ emb[a] + bq, wk @ emb[b] + bk, m, n) / hd ** 0.5

    return learned, rotated


def claim_learned_table(quick: bool) -> Claim:
    """The same two tokens at the same distance, moved: the score changes with a learned table.

    Measured on a trained table: the lab's 2017 model (learned positions, trained in the ablation
    recipe, seed 0; `shared.trained_2017`), head 0 of its first attention layer (`_trained_scores`):
    token a at position 10 + s against token b at 3 + s, s over the table's rows. Verdict: the median
    learned-table change is more than 1e5 times RoPE's (the module's "more than 10^5"); RoPE's change
    is floored at one float32 epsilon of its score, the smallest change float32 can show. The judged
    ratio is the measured figure, beside the median |score| that gives the change its scale. The
    module does not give the set-up behind its 5.78, so that figure is quoted, not compared.
    """
    c = Claim("15.1.learned-table-shift", "15.1", "learned absolute table: moving the pair changes its score",
              f"> 1e5 x RoPE's change (its example: a change of {MODULE_LEARNED_SHIFT})",
              unit="trained 2017 table, head 0 of layer 1: median |score change| / RoPE's, the change, the median "
                   "|score|",
              tolerance="median change > 1e5 x RoPE's median change (the module's factor); its 5.78 not compared")
    state, cfg = trained_2017(quick)
    learned_score, rope_score = _trained_scores(state, cfg)
    rows, eps = state["positions.table.weight"].shape[0], float(torch.finfo(torch.float32).eps)
    shifts = range(1, rows - 10, max(1, (rows - 11) // 12))
    g = torch.Generator().manual_seed(0)
    pairs = torch.randint(0, state["embed.weight"].shape[0], (20 if quick else 100, 2), generator=g)
    changes, rope_changes, scores = [], [], []
    with torch.no_grad():
        for a, b in pairs.tolist():
            base, rope_base = learned_score(a, b, 10, 3), rope_score(a, b, 10, 3)
            scores.append(abs(base))
            for sh in shifts:
                changes.append(abs(learned_score(a, b, 10 + sh, 3 + sh) - base))
                rope_changes.append(max(abs(rope_score(a, b, 10 + sh, 3 + sh) - rope_base), eps * abs(rope_base)))
    arr = np.array(changes)
    learned, rope_median, scale = float(np.median(arr)), float(np.median(rope_changes)), float(np.median(scores))
    ratio = learned / rope_median
    c.measured = {"ratio": float(f"{ratio:.3g}"), "change": float(f"{learned:.3g}"), "|score|": float(f"{scale:.3g}")}
    if quick:
        c.indicative = [said("15.1.learned-table-shift quick", steps=QUICK["steps"], width=cfg.d_model)]
    return c.judge(ratio > 1e5, said("15.1.learned-table-shift", rows=rows, width=cfg.d_model, head_width=cfg.head_dim,
                                     pairs=len(pairs), shift_first=shifts[0], shift_last=shifts[-1], change=learned,
                                     p5=float(np.percentile(arr, 5)), p95=float(np.percentile(arr, 95)), scale=scale,
                                     share=learned / scale, rope=rope_median, ratio=ratio))


def claim_no_entry() -> Claim:
    c = Claim("15.1.learned-table-no-entry", "15.1", "a learned table has no entry past its length; RoPE does",
              "error vs value", tolerance="the table raises, RoPE returns a finite rotation")
    table = LearnedPositions(512, 8)
    try:
        table(torch.tensor([512]))
        raised = ""
    except ValueError as e:
        raised = str(e)
    cos, sin = _head(8).cos_sin(torch.tensor([[10**6]]), torch.float32)
    finite = bool(torch.isfinite(cos).all() and torch.isfinite(sin).all())
    c.measured = "raises" if raised else "no error"
    return c.judge(bool(raised) and finite, said("15.1.learned-table-no-entry", rows=512, error=raised, far=10**6,
                                                 finite=finite))


def claim_frequency_ratio() -> Claim:
    d = 128
    inv = default_inv_freq(10000.0, d).double()
    ratio = float(inv[0] / inv[-1])
    exact = 10000.0 ** ((d - 2) / d)
    c = Claim("15.1.frequency-ratio", "15.1", "first pair 1 rad/token, last about 10,000x slower", 10000,
              measured=ratio, unit="theta_0 / theta_last at d = 128",
              tolerance="theta_0 = 1; the ratio equal to 10000^((d-2)/d) to 1e-6")
    return c.judge(float(inv[0]) == 1.0 and abs(ratio / exact - 1) < 1e-6,
                   said("15.1.frequency-ratio", first=float(inv[0]), ratio=ratio, d=d, d_minus_2=d - 2, exact=exact))


def claim_shift_both() -> Claim:
    c = Claim("15.1.shift-both", "15.1", "adding 5 to both positions leaves the dot product unchanged", 0.0,
              unit="|score change| (float32)", tolerance="float32 rounding: below 1e-5")
    rope = _head(2)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, generator=g), torch.randn(2, generator=g)
    worst = max(abs(rotated_score(rope, q, k, m + 5, n + 5) - rotated_score(rope, q, k, m, n))
                for m in range(0, 40, 3) for n in range(0, 40, 5))
    c.measured = worst
    return c.judge(worst < 1e-5, said("15.1.shift-both", by=5))


def plot_scores(out, quick: bool) -> list[str]:
    """Score of one token pair at offset 7 as the pair slides, in the model 15.1.learned-table-shift
    measures (the trained 2017 model's head 0, `_trained_scores`): flat for RoPE, not for its table."""
    from llamablock.lab.plots import new_figure, save

    state, cfg = trained_2017(quick)
    learned_score, rope_score = _trained_scores(state, cfg)
    off, (a, b) = 7, torch.randint(0, state["embed.weight"].shape[0], (2,), generator=torch.Generator().manual_seed(0))
    starts = list(range(state["positions.table.weight"].shape[0] - off))
    with torch.no_grad():
        rope = [rope_score(int(a), int(b), n + off, n) for n in starts]
        learned = [learned_score(int(a), int(b), n + off, n) for n in starts]
    fig, ax = new_figure()
    ax.plot(starts, rope, label="RoPE on the same projections (llamablock.rope)")
    ax.plot(starts, learned, label="the trained 2017 model's learned table", alpha=0.8)
    ax.set(xlabel="position n of the key (query at n + 7)", ylabel="score q . k / sqrt(d_head), head 0",
           title="Same two tokens, same distance, moved: the trained 2017 model")
    ax.legend()
    return save(fig, out, "rope-invariance.png")


def run(quick: bool, out) -> list[Claim]:
    learned = claim_learned_table(quick)
    learned.plots = plot_scores(out, quick)
    return [claim_identity(), claim_2d_pair(quick), claim_head(quick), learned,
            claim_no_entry(), claim_frequency_ratio(), claim_shift_both()]
