"""The run folder: what every side reads and writes (its modules: docs/architecture.md, "The
layout").
"""
