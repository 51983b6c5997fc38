"""``python -m kernelslot.verify.collective``: the command line of :mod:`kernelslot.verify.collective.cli`."""
import sys

from kernelslot.verify.collective.cli import main

sys.exit(main())
