"""The one error type a user sees, `UserError` (or a subclass): a mistake in the command line or
the config; `ddp_lab.command.cli` turns it into one line on stderr, exit 2.
"""


class UserError(ValueError):
    """A mistake in the command line or config, one line, no traceback (also a ValueError)."""
