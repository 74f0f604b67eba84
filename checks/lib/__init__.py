"""Helpers shared by several checks: facts read through the Host seam, pure parsers.

Records in ``checks/`` are ``typing.NamedTuple`` rather than frozen dataclasses: every
``audit`` command defines them at start-up, and a NamedTuple costs a sixth of a frozen
dataclass to define. A record stays a dataclass where a tuple would behave differently
(a field left out of comparisons, a field named like a tuple method).
"""
