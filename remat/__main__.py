"""``python -m remat``: the command line (:mod:`remat.cli`)."""

import sys

from remat.cli import main

sys.exit(main())
