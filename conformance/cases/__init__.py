"""Case functions: what runs on each rank.  Checks live in ``conformance.suite``."""
