"""The submitting command: what runs on the machine where a user types `python -m ddp_lab` (cli,
mistakes, validate, submit, job, lock, paste, status, study: docs/architecture.md, "The layout").
"""
