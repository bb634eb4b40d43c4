"""Boltforge: a GPU cluster scheduler that places gangs on the tightest interconnect free."""

__version__ = "0.1.0"
