"""Inductor-IR rules (scheduler-node fusion). Imported by ``optimus.rules`` so they register
with the others."""
