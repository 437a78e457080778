"""Checkpoint and tokenizer formats. They build models; models never know about files."""
