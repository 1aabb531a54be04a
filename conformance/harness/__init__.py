"""The harness: rank tasks, launchers and warm pools, device leases, probes, loading the implementation.

Nothing here judges a result; checks (``conformance.judge``) never know how ranks are launched.
"""
