"""Fast tests of the parts: in-process, or on small rank pools; no run of the suite."""
