"""One module per command-line subcommand (see llamablock.cli)."""
