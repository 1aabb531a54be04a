"""Unit tests of coc_impl, conformance and golden."""
