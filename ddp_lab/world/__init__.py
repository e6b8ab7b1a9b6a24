"""The rank's world: who it is and what it runs on (its modules: docs/architecture.md, "The
layout").
"""
