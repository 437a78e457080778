"""`python -m benchmarks [--quick] [--threads N] [NAME ...]`: the suite that `llamablock bench` runs."""

import sys

from benchmarks.runner import main

sys.exit(main(sys.argv[1:]))
