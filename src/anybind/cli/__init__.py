"""The command line, ``python -m anybind check|demo|info``, and the demo it runs.

===================  ==============================================================
module               what it holds
===================  ==============================================================
``_main``            the parser and the ``check`` and ``demo`` commands
``_info``            the ``info`` command: versions, routes, shim cache, JAX window
``_demo``            the transformation matrix over real library functions
``_demo_jaxbind``    JAXbind's three demos, ported
``_demo_recipes``    the recipes in the demo
===================  ==============================================================
"""
from ._main import main

__all__ = ["main"]
