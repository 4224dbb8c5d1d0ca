"""``optimus bench``: the zoo models (and, with ``--suite external``, TorchRec and Hugging
Face models: ``optimus.tools.bench.external``) through eager, Inductor, upstream and Optimus.

See ``optimus.tools.bench.harness`` for the measurement protocol, ``optimus.tools.bench.cli`` for
the command and ``optimus.tools.bench.report`` for the markdown generator.
"""

from .configs import CONFIG_NAMES, CONFIGS, upstream_fusion_options
from .harness import MODES, BenchOptions, run, run_config

__all__ = ["CONFIGS", "CONFIG_NAMES", "MODES", "BenchOptions", "run", "run_config", "upstream_fusion_options"]
