"""One module per command-line subcommand (see llamablock.cli): each parses, calls the library,
formats. `UsageError` is a mistake in what the user asked for: one line, exit status 2."""


class UsageError(Exception):
    """A mistake in what the user asked for: reported as one line, exit status 2."""
