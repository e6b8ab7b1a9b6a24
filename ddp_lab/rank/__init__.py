"""The rank's machinery: what surrounds train() on every rank, none of
it needed to read how data-parallel training works (its modules:
docs/architecture.md, "The layout").
"""
