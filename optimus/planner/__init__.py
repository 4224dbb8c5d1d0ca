"""The planner behind ``passes="auto"``: a cost model per device, peak-memory estimates, and
the choice of which rewrites pay off on a given model (see docs/planner.md)."""
