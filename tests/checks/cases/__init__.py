"""Pass and fail cases of each check, one module per check (see tests/support/cases.py)."""
