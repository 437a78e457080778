"""Experiments built on the library: ablations, long context, the token tracer."""
