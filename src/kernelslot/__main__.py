"""``python -m kernelslot``: the same as the ``kernelslot`` command."""
import sys

from kernelslot.cli import main

sys.exit(main())
