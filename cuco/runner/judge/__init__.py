"""One rank's judge, started by rank.py (`run.run_judge`).

The judge owns everything a score is made of, in a process the candidate cannot reach: the seeds (drawn
by rank 0's judge and shared among the judges, never written anywhere the candidate can read), every
rank's inputs, the reference, the comparisons and the clock. It comes in two kinds: `CandidateJudge` drives a
candidate's process through its stages (candidate.py), `BoundsJudge` times the workload's own reference compute
and collective with no candidate at all (bounds.py); what they share is `Judge` (base.py).
"""
