"""User-facing errors and the exit codes every command shares (docs/cli.md lists them)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a script can rely on: the same meaning for every `cuco` command."""

    OK = 0  # everything asked for was done and passed
    FAILED = 1  # the candidate failed, or a search ended with no passing candidate or because its proposer failed
    BAD_INPUT = 2  # a flag, a file, a workload or a configuration key is wrong
    CUCO = 3  # cuco itself could not do its part (its runner, a tool it needs, a folder it must write)
    INCOMPLETE = 4  # what was asked for needs what this machine lacks (GPUs): done as far as it could be
    INTERRUPTED = 130  # Ctrl-C; a search resumes where it stopped


class CucoError(Exception):
    """An error caused by the user's input (a file, a key, a flag); printed as one line, exit code 2."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message)


class CucoFailure(CucoError):
    """cuco's own failure, not the user's input nor the candidate's doing: printed as one line, exit code 3."""

    exit_code = ExitCode.CUCO


class NeedsGPU(CucoError):
    """What was asked for needs GPUs this machine does not have: exit code 4."""

    exit_code = ExitCode.INCOMPLETE
