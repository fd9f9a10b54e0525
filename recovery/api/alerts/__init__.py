"""alert-rules, alert-channels: what Lazarus watches and who it tells (what it cannot see,
uncovered-queues, is recovery/api/uncovered.py). Everyone reads rules and channels (a channel's
target only admins; its errors with URLs cut to scheme and host for the rest); admins create,
change, mute and delete rules, and create, change, disable, delete channels and rotate their
secret (shown once, in the answer that made it). Definitions of the kinds and their params:
docs/alerts.md and recovery/alerts/params.py. What the API takes and answers: ``serializers``;
the views: ``views``."""
