"""Evaluations on a cluster: the search's driver keeps the store, the proposers and the display; each evaluation
runs where the cluster places it (Ray)."""
