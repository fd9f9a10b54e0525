"""gunicorn settings for the console and API (`gunicorn console.wsgi -c deploy/gunicorn.conf.py`).

Environment: PORT (8000), WEB_CONCURRENCY (2 workers per core is gunicorn's advice; default 2),
GUNICORN_TIMEOUT (30 s: a request longer than that is a bug, bulk work runs as Celery jobs).
Static files are served by WhiteNoise from STATIC_ROOT after `manage.py collectstatic`.
"""

import os

bind = f"{os.environ.get('BIND_ADDRESS', '0.0.0.0')}:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
threads = int(os.environ.get("GUNICORN_THREADS", "2"))
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
graceful_timeout = 30
accesslog = "-"
errorlog = "-"
# The real client address when a proxy in front sets X-Forwarded-For (the login throttle keys on
# it; see LOGIN_PROXY_COUNT).
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
