"""``ab.check``: numerical verification of every rule an op has.

=============  ==================================================================
module         what it holds
=============  ==================================================================
``_report``    ``check``, the shared ``Context`` of one run, ``Report`` and
               ``RuleError``
``_checks``    the individual checks, in the order they run
``_torch``     the same checks through ``op.torch`` (``torch=True``; imported
               then)
=============  ==================================================================
"""
from ._report import Report, RuleError, check

__all__ = ["Report", "RuleError", "check"]
