"""Django for a benchmark script, on a scratch database of its own: BENCH_DATABASE_URL, else
``postgresql://postgres@127.0.0.1:5432/<default_name>``. Call ``setup_django`` before importing
anything of Django or Lazarus; it returns the database URL."""

import os


def setup_django(default_name, **environ):
    """``environ``: more settings for this script (set only where the caller's environment does
    not already)."""
    bench_db = os.environ.get(
        "BENCH_DATABASE_URL", f"postgresql://postgres@127.0.0.1:5432/{default_name}"
    )
    os.environ["DATABASE_URL"] = bench_db
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only-" + "x" * 40)
    for name, value in environ.items():
        os.environ.setdefault(name, value)

    import django

    django.setup()
    return bench_db
