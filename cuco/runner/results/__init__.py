"""What an evaluation finds, typed: the record, each rank's report, the bound, the statistics of the times, and
the comparison of two programs against the machine's noise."""
