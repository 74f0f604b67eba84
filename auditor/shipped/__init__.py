"""Programs shipped to hosts: each runs where the auditor is not installed, so each is the
standard library only (Python 3.6 and later), and is sent as source or run by its path.

- ``treeio``: opens paths inside a root and never outside it (symlinks, mounts, device
  nodes and FIFOs refused); the collector and the sysroot fixer carry it in front of them.
- ``collector_script``: the SSH collector, sent as source to the target's ``python3``.
- ``sysroot_fix``: the sysroot fix engine, embedded in a sysroot's fix and rollback scripts.
- ``nvml_child``: asks NVML in a child process, run by its path.
- ``probe_agent``: the measurements of ``audit probe``, run by the target's ``python3``.

``tests/auditor/shipped/test_standard_library.py`` holds each of them to the standard library.
"""
