"""``optimus bench`` with two more configurations for issue 16 (in this process only):

* ``optimus-noemb``: ``passes="all"`` without ``group_embedding_lookups`` (the row before the
  rule, measured in the same run);
* ``optimus-atomic``: ``passes="all"`` with the rule's atomic backward
  (``{"deterministic": False}``; the default is the sorted-segment backward).

Every other argument is ``optimus bench``'s; run serially (the extra configurations are
registered in this process, so no ``--workers``), e.g.::

    python docs/results/emb_rule_variants.py --model dlrm --mode train --device cuda \
        --size realistic --configs optimus-noemb,optimus-atomic --repeats 3 --json $OUT/emb-variants.json
"""

from __future__ import annotations

import sys

from optimus.bench import configs
from optimus.bench.cli import main
from optimus.core.registry import resolve

RULE = "group_embedding_lookups"


def _passes(rule_setting: object) -> dict[str, object]:
    """``passes="all"`` as a per-level dict, with ``RULE`` left out (False) or given options."""
    cfg = resolve("all")
    out: dict[str, object] = {}
    for level, names in cfg.rules.items():
        chosen: dict[str, object] = {n: True for n in names if n != RULE}
        if RULE in names and rule_setting is not False:
            chosen[RULE] = rule_setting
        out[level] = chosen
    return out


for name, setting, text in (
    ("optimus-noemb", False, "optimus.compile(passes='all') without group_embedding_lookups"),
    ("optimus-atomic", {"deterministic": False}, "optimus.compile(passes='all'), embedding rule with the atomic backward"),
):
    configs.CONFIGS[name] = configs.BenchConfig(name, text, True, configs._optimus(_passes(setting)), configs._nothing)
    configs.CONFIG_NAMES.append(name)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
