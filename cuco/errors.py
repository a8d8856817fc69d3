"""User-facing errors: one line that names what is wrong and where."""

from __future__ import annotations


class CucoError(Exception):
    """An error caused by the user's input (a file, a key, a flag); printed as one line, exit code 2."""

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message)
