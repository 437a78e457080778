"""`python -m benchmarks [--quick] [NAME ...]`: the same as `llamablock bench`."""

import sys

from llamablock.cli import main

sys.exit(main(["bench", *sys.argv[1:]]))
