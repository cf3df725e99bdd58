"""factory-boy factories for the ORM store's models."""

from __future__ import annotations

import factory

from durable_django.models import Run, RunTag
from durable_django.status import RunStatus


class RunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Run

    id = factory.Sequence(lambda n: f"run-{n}")
    workflow = "tests.factory"
    version = "1"
    namespace = "default"
    status = RunStatus.COMPLETED
    input = factory.Dict({})


class RunTagFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = RunTag

    run = factory.SubFactory(RunFactory)
    tag = "concurrency:factory"
    status = factory.SelfAttribute("run.status")
    namespace = factory.SelfAttribute("run.namespace")
