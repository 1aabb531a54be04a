"""The conformance suite: run with ``pytest --pyargs conformance.suite --coc-impl module:attr``."""
