"""prq's version, written only here (setuptools reads it without importing prq)."""

__version__ = "0.1.0"
