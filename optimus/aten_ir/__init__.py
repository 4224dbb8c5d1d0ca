"""Aten-IR: the functional post-grad forward/backward graphs. Importing the level registers
its graph view."""

from . import view  # noqa: F401  (registers the Aten-IR view with the core)
