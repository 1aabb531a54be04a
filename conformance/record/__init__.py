"""The record of a verdict: requirement levels, the checks a case recorded and their evidence, failures, the tally of
a run, expectations, the report's keys, and two runs compared.  The judge writes it; the plugins, the gate and the
report read it."""
