"""The one error type a user sees: a mistake in the command line or the config.

Everything that can reject a command before a process starts raises a `UserError` (or a
subclass: `ddp_lab.launch.LaunchError`, `ddp_lab.config.registry.UnknownName`); the CLI wrapper
(`ddp_lab.command.cli`) is the one place that turns it into `error: <message>` on stderr, exit 2.
"""


class UserError(ValueError):
    """A mistake in the command line or config: printed as one line, no traceback.
    (A ValueError: code that checks values raises it where a ValueError is expected.)"""
