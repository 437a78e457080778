"""Figures of module section 15.1 (`rope-visualizer`) and 15.2 (`rope-scaling`).

rope-visualizer: one query pair and one key pair of a head, rotated by the library's RoPE
(`Rotary.cos_sin` + `Rotary.rotate`, the module's neighbouring-pair layout), at positions m and n.
The frequency is chosen as a pair index i of a head of width d: theta_i = base^(-2i/d)
(`default_inv_freq`). The reply holds both rotated arrows, the angle between them, their dot
product, and the same score computed a second way, q . R(n - m) k, which is the identity of
15.1: it depends only on the gap.

rope-scaling: the per-pair table of `llamablock.diagnostics.rope_table`, the code behind `llamablock rope`.
"""

from __future__ import annotations

import math

import torch
from fastapi import APIRouter, Query

from llamablock.diagnostics.rope_table import compare_methods
from llamablock.rope import Rotary
from llamablock.rope_scaling import RopeSpec, default_inv_freq
from llamablock.web.errors import APIError

router = APIRouter()

MAX_POSITION = 131072  # Llama 3.1's context; past it float32 angles lose the digits shown
HEAD_DIMS = (8, 16, 32, 64, 80, 96, 128, 256)


def _rotate(rotary: Rotary, pair: int, q, k, m: float, n: float) -> tuple[list[float], list[float]]:
    """q at position m and k at position n, as rows of one head; return their rotated pairs."""
    hd = rotary.spec.rotary_dim
    x = torch.zeros(1, 1, 2, hd)  # (b, h, t, hd): t = 0 the query, t = 1 the key
    x[0, 0, 0, 2 * pair : 2 * pair + 2] = torch.tensor(q)
    x[0, 0, 1, 2 * pair : 2 * pair + 2] = torch.tensor(k)
    cos, sin = rotary.cos_sin(torch.tensor([[m, n]]), torch.float32)  # (1, 2, hd/2)
    rot = rotary.rotate(x, cos, sin)[0, 0, :, 2 * pair : 2 * pair + 2]  # (2, 2)
    return rot[0].tolist(), rot[1].tolist()


def _angle(v) -> float:
    return math.atan2(v[1], v[0])


@router.get("/api/rope-visualizer")
def rope_visualizer(
    m: int = Query(3, ge=0, le=MAX_POSITION, description="query position"),
    n: int = Query(1, ge=0, le=MAX_POSITION, description="key position"),
    pair: int = Query(0, ge=0, le=127, description="pair index i (0 = fastest)"),
    head_dim: int = Query(128, description=f"head width, one of {HEAD_DIMS}"),
    base: float = Query(10000.0, gt=1.0, le=1e9, allow_inf_nan=False, description="RoPE base"),
    q0: float = Query(1.0, ge=-10, le=10, allow_inf_nan=False),
    q1: float = Query(0.25, ge=-10, le=10, allow_inf_nan=False),
    k0: float = Query(0.6, ge=-10, le=10, allow_inf_nan=False),
    k1: float = Query(0.8, ge=-10, le=10, allow_inf_nan=False),
) -> dict:
    if head_dim not in HEAD_DIMS:
        raise APIError("head_dim", f"head_dim must be one of {list(HEAD_DIMS)}, got {head_dim}")
    if pair >= head_dim // 2:
        raise APIError("pair", f"pair must be below head_dim / 2 = {head_dim // 2}, got {pair}")
    # One head of the width asked for, default (unscaled) RoPE, the module's pair layout.
    rotary = Rotary(RopeSpec(base, head_dim, MAX_POSITION + 1), "interleaved")
    q, k = [q0, q1], [k0, k1]
    q_rot, k_rot = _rotate(rotary, pair, q, k, m, n)
    # The 15.1 identity, computed independently: leave q where it is, turn k by n - m alone.
    q_same, k_gap = _rotate(rotary, pair, q, k, 0, n - m)
    theta = float(default_inv_freq(base, head_dim)[pair])
    between = math.degrees(_angle(k_rot) - _angle(q_rot))
    between = (between + 180.0) % 360.0 - 180.0  # in [-180, 180)
    return {
        "m": m, "n": n, "pair": pair, "head_dim": head_dim, "base": base,
        "theta": theta, "wavelength": 2 * math.pi / theta,
        "turn_q_rad": m * theta, "turn_k_rad": n * theta,  # total angle turned, before wrapping
        "q": q, "k": k, "q_rot": q_rot, "k_rot": k_rot,
        "angle_q_deg": math.degrees(_angle(q_rot)), "angle_k_deg": math.degrees(_angle(k_rot)),
        "angle_between_deg": between,
        "dot": float(torch.tensor(q_rot) @ torch.tensor(k_rot)),
        "dot_from_gap": float(torch.tensor(q_same) @ torch.tensor(k_gap)),
        "dot_unrotated": float(torch.tensor(q) @ torch.tensor(k)),
    }


@router.get("/api/rope-scaling")
def rope_scaling(
    train_len: int = Query(4096, ge=16, le=1 << 20, description="tokens the model was trained on"),
    target_len: int = Query(32768, ge=16, le=1 << 24, description="tokens it is run at"),
    head_dim: int = Query(128, description=f"head width, one of {HEAD_DIMS}"),
    base: float = Query(10000.0, gt=1.0, le=1e9, allow_inf_nan=False, description="RoPE base"),
) -> dict:
    if head_dim not in HEAD_DIMS:
        raise APIError("head_dim", f"head_dim must be one of {list(HEAD_DIMS)}, got {head_dim}")
    if target_len < train_len:
        raise APIError("target_len", f"target_len ({target_len}) must be at least train_len ({train_len}): "
                                     "the figure is about running past the training length")
    try:
        methods = compare_methods(train_len, target_len, head_dim, base)
    except ValueError as e:
        raise APIError(None, str(e)) from None
    # Columns per method for drawing; the records themselves are rope_table's.
    return {
        "train_len": train_len, "target_len": target_len, "head_dim": head_dim, "base": base,
        "factor": target_len / train_len,
        "methods": [{
            "name": m["method"], "label": m["label"], "attention_factor": m["attention_factor"],
            "wavelength": [p["scaled_wavelength"] for p in m["pairs"]],
            "unscaled_wavelength": [p["wavelength"] for p in m["pairs"]],
            "ratio": [p["interpolation_ratio"] for p in m["pairs"]],
            "unseen": [p["unseen_at_target"] for p in m["pairs"]],
            "crowded": [p["crowded"] for p in m["pairs"]],
            "n_unseen": len(m["unseen_pairs"]), "n_crowded": len(m["crowded_pairs"]),
        } for m in methods],
    }
