"""OpenTelemetry traces into the audit's input storage: OTLP decoding (``otlp``), the messaging
spans' rows (``schema``, ``spans``) and their durable Parquet store (``store``). No Django, no
models: the endpoint that feeds them is the console's."""
