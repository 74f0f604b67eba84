"""Shared test support: factories, sysroots, the generated hosts, real sshd and fix helpers."""
