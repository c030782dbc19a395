"""mxq's version: one definition, read by pyproject.toml (setuptools dynamic version), ``mxq.__version__``
and the kernel cache's fingerprint, without importing the package."""

__version__ = "0.1.0"
