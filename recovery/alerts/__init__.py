"""Alerts: rules, evaluation on beat, and the notification outbox (docs/alerts.md)."""
