"""``python -m conformance.expectations --summary coc-summary.json --out FILE``: write or update known outcomes."""

from conformance.gating.expectations import main

if __name__ == "__main__":
    raise SystemExit(main())
