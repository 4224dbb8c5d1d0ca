"""``python -m optimus.tools.fuzz``: the fuzzer's command line (also ``optimus fuzz``)."""

import sys

from .cli import main

sys.exit(main())
