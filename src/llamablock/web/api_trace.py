"""Figure of module section 15.6 (`token-tracer-compare`): placeholder until llamablock.trace lands."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
