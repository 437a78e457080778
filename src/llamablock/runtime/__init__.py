"""Generation, sampling and evaluation, behind an engine interface (prefill, step)."""
