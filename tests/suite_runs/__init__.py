"""Runs of the conformance suite (or a pytest session with its plugin) in subprocesses, and what they show."""
