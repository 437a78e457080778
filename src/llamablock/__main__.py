import sys

from llamablock.cli import main

sys.exit(main())
