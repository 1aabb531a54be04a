"""Adapters: third-party CoC implementations behind the plug-in protocol (``conformance.protocol``).

An adapter imports its implementation from where the user points it (it copies
none of it), so the suite judges the implementation's own code.  Each has an
expectations file beside it (``<name>.expectations.toml``) listing its known
non-conformances, for ``--coc-expectations``.
"""
