"""The planner behind ``passes="auto"``: a cost model per device, peak-memory estimates, and
the choice of which rewrites pay off on a given model (see docs/planner.md).

What the rest of Optimus calls:

* ``plan_compile`` / ``plan_graph``: the passes of one graph under ``"auto"``, with this
  graph's ``Planner`` attached (``optimus.compile`` / ``optimus.optimize``); with
  ``tune=True``, the fastest candidate plan measured on the graph (``tune``);
* ``Planner``: what the FX driver asks about every horizontal group, through
  ``core.group.GroupPlanner`` (its order, its cut for memory, whether it pays);
* ``ScheduleMemory``: the Inductor-IR driver's bound on the peak memory of the kernels it
  merges (a rule's ``memory_increase``).
"""

from .plan import Context, Planner, plan_compile, plan_graph
from .schedule_memory import ScheduleMemory

__all__ = ["Context", "Planner", "ScheduleMemory", "plan_compile", "plan_graph"]
