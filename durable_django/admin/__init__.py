"""The admin: runs, read-only, with *cancel* and *retry* actions (and buttons on a run's
page) and the quota page; and schedules, with their last error and next due time.

Django loads this package only when ``django.contrib.admin`` is installed (admin
autodiscovery). Everything here reads the ORM store's tables; every change of a run's
state goes through the default engine (``durable_django.engine``), never a raw update,
so the quota, the tags' copy of the status and the Django signals stay right.
"""

from .quotas import quota_row
from .runs import RunAdmin, refusal_text
from .schedules import ScheduleAdmin

__all__ = ["RunAdmin", "ScheduleAdmin", "quota_row", "refusal_text"]
