"""The one base class of the errors a user can fix: bad input or a fault of the environment.

Every module raises its own subclass (``ConfigError``, ``CheckpointError``,
``DataError``, ...) with a one-line message that says what happened and what to
do. The command line catches :class:`UserError` alone and prints that line;
anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A failure the user can act on; its message is one line, meant to be printed as it is."""
