"""Root conftest: make the suite's plugin active in a source checkout too.

When the package is installed the ``pytest11`` entry point has already
registered ``conformance.plugin`` under this same name, so this is a no-op.
"""

pytest_plugins = ["conformance.plugin"]
