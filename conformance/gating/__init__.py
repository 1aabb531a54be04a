"""CI gating: known outcomes, run summaries compared with a baseline, the conformance matrix."""
