"""Torch-IR: Dynamo's pre-grad FX graphs. Importing the level registers its graph view."""

from . import view  # noqa: F401  (registers the Torch-IR view with the core)
