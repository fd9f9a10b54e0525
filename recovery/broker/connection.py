"""AMQP connections to the watched RabbitMQ: parameters per vhost."""

import pika
from django.conf import settings


def amqp_parameters(vhost=None, url=None, **overrides):
    """pika parameters for RABBITMQ_URL, optionally switched to another vhost."""
    params = pika.URLParameters(url or settings.RABBITMQ_URL)
    if vhost is not None:
        params.virtual_host = vhost
    for name, value in overrides.items():
        setattr(params, name, value)
    return params


def connect(vhost=None, **overrides):
    overrides.setdefault("heartbeat", 30)
    overrides.setdefault("blocked_connection_timeout", 60)
    return pika.BlockingConnection(amqp_parameters(vhost, **overrides))
