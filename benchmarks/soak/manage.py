"""``manage.py`` of the soak's processes: the soak's Celery app loaded, as a project's
``__init__.py`` would load it, then Django's command line (``durable tick``)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.soak.settings")
    from django.core.management import execute_from_command_line

    import benchmarks.soak.app  # noqa: F401  (messages go to the soak's broker)

    execute_from_command_line(sys.argv)
