"""User-facing errors: the CLI prints their message without a traceback."""


class SimsearchError(Exception):
    """Bad input or an unusable service; the message says what, where, and what to do."""


class DataError(SimsearchError, ValueError):
    """A data file (QA set, corpus, SFT pairs) that cannot be read: names file, line and key."""


class ServiceError(SimsearchError, RuntimeError):
    """A server that failed after bounded retries: names the URL, the attempts, the last error."""


class RecipeError(ValueError):
    """A recipe that cannot run: says which file and key, and what to do."""


class NonFiniteError(SimsearchError, FloatingPointError):
    """A model whose logits came out inf or nan: names the rows and the generated token.

    Attributes:
        rows: The generate call's output rows (prompt-major: prompt i, sample j is i * n + j) that hit them.
    """

    def __init__(self, message: str, rows: list[int]) -> None:
        super().__init__(message)
        self.rows = rows
