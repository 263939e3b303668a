"""User-facing errors.

Anything a user can cause (a bad path, a broken file, a prompt that does not fit)
raises ``ThorError``; the CLI prints its one-line message and exits 2, the API answers
4xx. Everything else is a bug and keeps its traceback.
"""


class ThorError(Exception):
    """Bad input: a message that names the problem, never a traceback."""

    exit_code = 2


class NoValidPlan(ThorError):
    """The planner ran out of repair attempts (CLI exit 3)."""

    exit_code = 3
