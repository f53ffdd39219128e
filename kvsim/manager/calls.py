"""Public calls: each returns its value, and, to an executor that asks, what it did.

A method marked :func:`public_call` runs its body with a fresh :class:`~kvsim.manager.plan.Plan`
to record into (copy batches, bookkeeping counts, events). Two ways to call it:

* ``cache.resize(8)`` returns the body's value, as KVCM2's API does; the plan is dropped;
* ``cache.resize.with_plan(8)`` returns an :class:`Outcome`: the value and the plan, and the
  :class:`~kvsim.errors.KvsimError` the call raised, if any, instead of raising it (the call
  then changed nothing; its plan still counts the work it did before it failed, which an
  executor prices like any other). This is what executors call; nothing is left behind in the
  manager for anyone to pick up.

Each call has a name (``"KvCache.resize"``): what ``Plan.api`` says, and what the runtime's API
table (:mod:`kvsim.runtime.apis`) declares a lock mode for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

from kvsim.errors import KvsimError
from kvsim.manager.plan import Plan

_new = tuple.__new__  # a named tuple made without its generated __new__ (a Python frame)


class Outcome(NamedTuple):
    """What one call returned (``value``), what it did (``plan``), and how it failed."""

    value: Any
    plan: Plan
    error: KvsimError | None = None

    @property
    def ok(self) -> bool:
        """The call neither raised nor refused (returned False)."""
        return self.error is None and self.value is not False and self.plan.ok


class _BoundCall:
    __slots__ = ("_call", "_obj")

    def __init__(self, call: PublicCall, obj: object) -> None:
        self._call = call
        self._obj = obj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        outcome = self._call.run(self._obj, args, kwargs)
        if outcome.error is not None:
            raise outcome.error
        return outcome.value

    def with_plan(self, *args: Any, **kwargs: Any) -> Outcome:
        return self._call.run(self._obj, args, kwargs)

    def __repr__(self) -> str:
        return f"<public call {self._call.name} of {self._obj!r}>"


class PublicCall:
    """A descriptor: see the module docstring. ``mutates`` False marks a read-only query (no
    LRU tick, no snapshot, allowed after shutdown); ``skip_if(obj)`` true makes the call do
    nothing at all (closing a closed cache), with an empty plan."""

    def __init__(self, name: str, body: Callable[..., Any], mutates: bool,
                 skip_if: Callable[[Any], bool] | None) -> None:
        self.name = name
        self.body = body
        self.mutates = mutates
        self.skip_if = skip_if
        functools.update_wrapper(self, body)

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        return self if obj is None else _BoundCall(self, obj)

    def run(self, obj: Any, args: tuple, kwargs: dict) -> Outcome:
        manager = getattr(obj, "_manager", obj)
        plan = Plan(self.name)
        if self.skip_if is not None and self.skip_if(obj):
            return Outcome(None, plan)
        try:
            if self.mutates:
                value = manager._mutate(plan, self.body, obj, args, kwargs)
            else:
                value = self.body(obj, plan, *args, **kwargs)
        except KvsimError as e:
            plan.ok = False
            return Outcome(None, plan, e)
        return _new(Outcome, (value, plan, None))  # Outcome(value, plan), without its __new__


# The name of every public call defined (the manager's modules define them on import): what a
# plan's ``api`` can say, and what a CPU preset's per-method costs may name.
CALL_NAMES: set[str] = set()


def public_call(name: str, mutates: bool = True, skip_if: Callable[[Any], bool] | None = None
                ) -> Callable[[Callable[..., Any]], PublicCall]:
    """Mark ``body(self, plan, *args)`` as the public call ``name`` (see the module docstring)."""
    CALL_NAMES.add(name)
    return lambda body: PublicCall(name, body, mutates, skip_if)
