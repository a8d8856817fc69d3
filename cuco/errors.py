"""User-facing errors and the exit codes every command shares (docs/cli.md lists them)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a script can rely on: the same meaning for every `cuco` command (MEANING says it in words)."""

    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    CUCO = 3
    INCOMPLETE = 4
    INTERRUPTED = 130


MEANING = {  # (in a word, in full)
    ExitCode.OK: ("passed", "everything asked for was done and passed; a search found a passing program, even where "
                            "the program it started from failed (its summary and summary.json then say so, and why)"),
    ExitCode.FAILED: ("failed", "the candidate failed; a search ended without a passing program, or its proposer "
                                "failed"),
    ExitCode.BAD_INPUT: ("bad input", "a flag, a file, a workload (its workload.toml or reference.py), a "
                                      "configuration key"),
    ExitCode.CUCO: ("cuco's own failure", "its runner, a tool it needs (nvcc), a folder it must write"),
    ExitCode.INCOMPLETE: ("needs GPUs", "this machine lacks the GPUs asked for: done as far as it could be (a CUDA "
                                        "program built)"),
    ExitCode.INTERRUPTED: ("interrupted", "Ctrl-C; a search resumes where it stopped"),
}


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
