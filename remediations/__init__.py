"""The verbs of a fix: step kinds and remedies (``steps``), and the boot command line edit
(``boot``) every check that needs a kernel parameter shares. A check's own remedies live
in its module, in its ``remediate``."""
