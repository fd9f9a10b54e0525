"""OpenTelemetry traces into the audit's input storage: OTLP decoding (``otlp``), the messaging
spans' rows (``schema``, ``spans``) and their durable Parquet store (``store``). Pure of Django
except ``store``'s settings readers and ``metrics``."""
