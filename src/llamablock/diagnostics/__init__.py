"""Tools for the mistakes practitioners make: RoPE tables, lint and layout checks, KV-cache sizes."""
