"""Whether an aiohttp request was routed by its host (a sub-application added with
``add_domain``): then the scope's route template starts with the host the router matched
(see :func:`~idempotency_async.integrations._http.host_route`)."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable

from aiohttp import web

__all__ = ["DomainRouting"]


class DomainRouting:
    """Whether requests through a chain of applications were routed by host, worked out
    once per chain: a frozen application's routes no longer change, and walking every
    resource of every parent on each request costs as much as the routes are many."""

    def __init__(self) -> None:
        # By root application (gone with it), then by the chain of sub-applications below
        # it, by identity: they live as long as the root's router that holds them.  Keyed
        # by id with a weak reference, not a WeakKeyDictionary: applications before
        # aiohttp 3.11 are unhashable.
        self._chains: dict[int, tuple[weakref.ref[web.Application], dict[tuple[int, ...], bool]]]
        self._chains = {}

    def by_domain(self, apps: tuple[web.Application, ...]) -> bool:
        if len(apps) < 2:
            return False  # no sub-application: nothing was routed by host
        root = apps[0]
        entry = self._chains.get(id(root))
        if entry is None or entry[0]() is not root:
            entry = (weakref.ref(root, self._forget(id(root))), {})
            self._chains[id(root)] = entry
        chains = entry[1]
        chain = tuple(map(id, apps[1:]))
        routed = chains.get(chain)
        if routed is None:
            routed = chains[chain] = _routed_by_host(apps)
        return routed

    def _forget(self, key: int) -> Callable[[weakref.ref[web.Application]], None]:
        def forget(gone: weakref.ref[web.Application]) -> None:
            entry = self._chains.get(key)
            if entry is not None and entry[0] is gone:
                del self._chains[key]

        return forget


def _routed_by_host(apps: tuple[web.Application, ...]) -> bool:
    """Whether a request was routed by its host: one of the sub-applications it went
    through was added with ``add_domain`` (the route's template leaves the host out)."""
    for parent, child in itertools.pairwise(apps):
        for resource in parent.router.resources():
            info = resource.get_info()
            if info.get("app") is child and "rule" in info:
                return True
    return False
