"""The example site under HTTP load (gunicorn and wrk): ``python -m benchmarks.http_load``."""
