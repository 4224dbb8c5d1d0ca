"""``python -m optimus.tools.bench ...``: the same as ``optimus bench ...``."""

import sys

from .cli import main

sys.exit(main())
