"""The start path against a view's insert and ``.delay()`` and Procrastinate's ``defer``:
``python -m benchmarks.start_path``."""
