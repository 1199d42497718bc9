"""`python -m sandtree`: the command line, as the `sandtree` script."""

import sys

from .cli import main

sys.exit(main())
