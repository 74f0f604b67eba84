"""The built-in checks, one module per check.

Each module holds one :class:`auditor.check.Check` subclass: what it reads, how it
judges, and, where software can fix what it finds, its ``remediate``. They are
registered in the ``host_auditor.checks`` entry-point group (``pyproject.toml``),
as plug-ins are; helpers shared by several checks live in :mod:`auditor.checks.lib`.
"""
