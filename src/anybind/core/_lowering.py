"""The one interface between what an op is (``core``) and where its code runs (``routes``).

Traced code is JAX code: the primitive inlines it (``_primitive``). Any other
code (host, compiled, device) is lowered by a *route*, an object with

==================  ===============================================================
member              what it is
==================  ===============================================================
``name``            a short name (``"pyffi"``, ``"compiled"``, ...), for messages
``claims(site)``    whether this route lowers ``site`` (a ``Site``)
``lower(site, *a)`` the MLIR values of the role's results, from the operands ``a``
``adopt(...)``      optional: checks (or registers) code as an op is bound or a rule
                    set, so that what a route cannot run is a TypeError at once
==================  ===============================================================

Routes register themselves in order (``anybind.routes``); the first that
claims a site lowers it, so a new route is a new module and one line there.
A route may hand a site back (``lower(site2, *a)``) after changing it, as the
device route does for a device rule's host fallback in a CPU program.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from ._spec import Batch, Call, Rule


@dataclasses.dataclass(frozen=True, eq=False)
class Site:
    """One role of one primitive application being lowered."""
    ctx: Any                 # JAX's lowering rule context
    role: str                # "primal", "fwd", "jvp", "vjp" or "transpose"
    call: Call
    batch: Batch | None
    lin: Any                 # which linear operands are present (derived roles)
    need: Any                # which input cotangents are produced (vjp, transpose)
    rule: Rule               # the code that implements the role here
    name: str                # "function", "jvp rule", "vmap rule", ... in messages
    by_vmap_rule: bool       # the batched primal, run by the op's vmap rule
    effect: bool             # must run exactly once per execution

    @property
    def op(self):
        return self.call.op

    def replace(self, **changes) -> Site:
        return dataclasses.replace(self, **changes)


class Route(Protocol):
    name: str

    def claims(self, site: Site) -> bool: ...

    def lower(self, site: Site, *args) -> Sequence: ...


ROUTES: list = []


def register(route: Route) -> None:
    """Add a route after those registered before it (earlier routes win)."""
    if all(r.name != route.name for r in ROUTES):
        ROUTES.append(route)


def adopt(op, kind: str, fn, traced: bool, device: bool, host, where: str) -> None:
    """Code given to ``where`` (``"ab.bind"``, ``"def_jvp"``, …) as the op's ``kind``
    (``"function"``, ``"jvp"``, ``"jvp.vmap"``, …): every route that checks or
    registers code when it is given does so now."""
    for route in ROUTES:
        hook = getattr(route, "adopt", None)
        if hook is not None:
            hook(op, kind, fn, traced, device, host, where)


def lower(site: Site, *args) -> Sequence:
    for route in ROUTES:
        if route.claims(site):
            return route.lower(site, *args)
    raise NotImplementedError(
        f"anybind op '{site.op.name}': no route runs its {site.name} here (routes: "
        f"{[r.name for r in ROUTES] or 'none registered; import anybind'})")
