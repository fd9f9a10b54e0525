"""Forms of the operator console, one module per part of it (replay, people, audits, alerts).
GET filters go through a Form too, never raw request.GET; the message filter itself is
``recovery.search.filters.MessageFilterForm``."""
