"""Retention, a process over the store: ``run`` deletes what is past RETENTION_DAYS (archiving
it first with RETENTION_ARCHIVE_DIR set), ``archive`` writes and reads that archive
(``manage.py import_archive``), and ``tasks`` is beat's hourly run."""
