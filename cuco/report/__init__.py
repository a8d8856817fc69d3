"""Presenting results: console tables now; plots, HTML report and web UI later."""
