"""Remedies more than one check shares: the boot command line edit (``boot``) every check
that needs a kernel parameter uses. A check's own remedies live in its module, in its
``remediate``; the model they are made of (step kinds, ``Remedy``, ``Advice``,
``FixContext``) is the core's, :mod:`auditor.remedy`."""
