"""``python -m optimus.bench ...``: the same as ``optimus bench ...``."""

import sys

from .cli import main

sys.exit(main())
