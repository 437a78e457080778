"""Byte sizes: bytes per element of each dtype name the commands accept, and human-readable sizes."""

from __future__ import annotations

# Bytes per element by the names the command line and the web page use (torch's element_size()).
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: float) -> str:
    """Binary units, about three significant figures, no trailing zeros: 4 GiB, 128 MiB, 1.5 GiB."""
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(UNITS) - 1:
        value, unit = value / 1024, unit + 1
    if unit == 0:
        return f"{int(value)} B"
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    text = f"{value:.{digits}f}"
    text = text.rstrip("0").rstrip(".") if "." in text else text
    return f"{text} {UNITS[unit]}"


def available_memory() -> int | None:
    """Bytes the kernel says a new allocation can take without swapping (Linux's MemAvailable in
    /proc/meminfo); None where that is not known (another OS), so that callers check nothing."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
