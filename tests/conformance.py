"""Whether an object satisfies a typing.Protocol, member by member: every attribute the protocol
declares exists, and every method exists and takes the protocol's arguments. `isinstance` with a
runtime_checkable protocol checks names only; this reads signatures too (inspect), so that a
method that lost or renamed a parameter fails here, not at the first call that passes it.

    members(P)           the names P declares: annotated attributes and methods
    mismatches(obj, P)   one line per member obj lacks or cannot be called as P says ([] = conforms)
"""

from __future__ import annotations

import inspect

_KINDS = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def members(protocol: type) -> dict[str, object]:
    """Name -> the protocol's function for methods, None for attributes (declared by annotation)."""
    out: dict[str, object] = {name: None for name in getattr(protocol, "__annotations__", {})}
    out.update({name: value for name, value in vars(protocol).items()
                if inspect.isfunction(value) and not name.startswith("_")})
    return out


def _call_mismatch(name: str, want, have) -> str | None:
    """Why `have` (a bound method) cannot take every call that `want` (the protocol's function) allows."""
    try:
        got = inspect.signature(have)
    except (TypeError, ValueError):
        return None  # a builtin without a signature: nothing to compare
    expected = [p for p in inspect.signature(want).parameters.values() if p.name != "self"]
    params = list(got.parameters.values())
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params):
        return None
    positional = [p for p in params if p.kind in _KINDS]
    for i, p in enumerate(p for p in expected if p.kind in _KINDS):
        if i >= len(positional) or positional[i].name != p.name:
            return f"{name}: takes {got}, the protocol passes {p.name!r} as argument {i + 1}"
    named = {p.name for p in params}
    for p in expected:
        if p.kind == inspect.Parameter.KEYWORD_ONLY and p.name not in named:
            return f"{name}: takes {got}, without the protocol's keyword {p.name!r}"
    extra = [p for p in positional[len([p for p in expected if p.kind in _KINDS]):] if p.default is p.empty]
    if extra:
        return f"{name}: takes {got}, whose {extra[0].name!r} the protocol never passes"
    return None


def mismatches(obj, protocol: type) -> list[str]:
    out = []
    for name, want in members(protocol).items():
        if not hasattr(obj, name):
            out.append(f"{name}: missing")
        elif want is not None:
            have = getattr(obj, name)
            why = f"{name}: not callable" if not callable(have) else _call_mismatch(name, want, have)
            if why:
                out.append(why)
    return out
