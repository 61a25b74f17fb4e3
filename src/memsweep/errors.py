"""The expected ways a job ends other than `ok`. Each maps to one `status` in results.json."""


class ConfigError(Exception):
    """Bad input (a path, a column, a value): the message names the key and what is allowed."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


class Unsupported(Exception):
    """A combination that cannot run here; `rules.py` raises it before any work is done."""


class Diverged(Exception):
    """The training loss became NaN or inf."""
