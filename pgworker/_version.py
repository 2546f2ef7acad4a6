"""The version of pgworker: one module with nothing to import, so that the package, tracing,
metrics and the worker's registry can all read it without importing one another
(setuptools reads it too, via pyproject's dynamic version)."""

__version__ = "0.1.0"
