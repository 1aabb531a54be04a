"""The suite's pytest features, one small plugin module each, registered by :mod:`conformance.plugin`."""
