"""A start's options, one value passed down the start path."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..._rules import concurrency as quotas
from .. import waiting


@dataclass(frozen=True, slots=True)
class StartOptions:
    """How a start is made, besides its workflow, input and run id: the keyword options of
    ``Wf.dispatch``, ``engine.start`` and their twins, built once where the call comes in
    and passed down the start path as one value (change one with
    ``dataclasses.replace``). Each means what it means on :meth:`Engine.start
    <durable_django.Engine.start>`; a batch and a child start use the first ones."""

    concurrency: quotas.ConcurrencyOption = None
    tags: Iterable[str] = ()
    namespace: str | None = None
    wait: waiting.Wait = None
    ticket: str | None = None
    rate_limit: quotas.RateLimitOption = None


#: A start with every option left as it is.
DEFAULT_OPTIONS = StartOptions()


__all__ = ["DEFAULT_OPTIONS", "StartOptions"]
