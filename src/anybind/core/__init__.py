"""What an op is: everything but where its code runs (``routes``) and its front ends.

=================  ===================================================================
module             what it holds
=================  ===================================================================
``_jax``           the one seam for JAX's non-public API, per JAX release
``_spec``          what the user declared (``Rule``, ``like``) and one call (``Call``,
                   ``Batch``)
``_code``          what kind of code a function is (compiled or Python)
``_errors``        ``MissingRuleError``, ``HostError`` and where host errors wait
``roles``          the five roles of an op's primitives and what implements each
``_primitive``     the family of primitives of an op, every rule registered in one block
``_derivatives``   jvp, transpose and linearize rules of the family
``_multilinear``   the same for multilinear ops
``_batching``      the vmap rule of the family: one batch axis per primitive
``_sharding``      the shard rule (``shard=``) and how it types outputs
``_closures``      closure conversion of traced code that closes over tracers
``_lifetime``      eager calls, and how long an op and its programs live
``_debug``         debug mode (``ab.debug``)
``_lowering``      the interface to the routes that lower host, compiled, device code
``_frontends``     the registry that front ends (torch) fill
=================  ===================================================================

Imports run down from ``_primitive`` to ``_jax``; nothing here imports
``routes``, a front end, ``check`` or the public API.
"""
