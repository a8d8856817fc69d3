"""Each planted fault: the cascade level that must catch it and words its error must contain."""

FAULTS = {
    # name: (failed level, substrings of the error (a tuple: one of them), substrings that must NOT appear)
    "no_compile": ("L1", ["no_compile", "error"], []),
    "forbidden_timer": ("L0", ["forbidden"], []),
    "deadlock": ("L2", ["timeout", "killed every rank"], []),
    "crash_rank1": ("L2", ["crash", "rank 1", "SIGSEGV"], ["rank 0 killed by SIGSEGV"]),
    "wrong_rank1": ("L2", ["rank 1", "out of tolerance"], ["rank 0:"]),
    "partial_output": ("L2", ["NaN/Inf", "unwritten"], []),
    "nan_output": ("L2", ["NaN/Inf"], []),
    # Caught by its time (below the bound) or by the timed run's output it never wrote, whichever a machine shows
    # first: where the runner's own cost per run exceeds the tiny bound, only the output gives it away.
    "skips_work": ("L4", [("below the physical bound", "a timed run's output is wrong")], []),
}


def assert_caught(name: str, record) -> None:
    """The record shows the planted fault caught at its level, with the right words."""
    level, must, must_not = FAULTS[name]
    assert not record.ok, record
    assert record.failed_level == level, record.error
    for word in must:  # a tuple: any one of its words
        assert any(w in record.error for w in (word if isinstance(word, tuple) else (word,))), record.error
    for word in must_not:
        assert word not in record.error, record.error
