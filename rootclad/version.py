"""The version of the package (the exported files record it)."""

__version__ = "0.1.0"
