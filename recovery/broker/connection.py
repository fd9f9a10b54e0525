"""AMQP connections to the watched RabbitMQ: parameters per vhost, over the nodes of a cluster."""

import urllib.parse

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


def node_urls(url=None):
    """``url`` (default RABBITMQ_URL) and, when it is RABBITMQ_URL, the same URL on each of
    RABBITMQ_NODES: the order connections try the cluster's nodes in."""
    if url is not None and url != settings.RABBITMQ_URL:
        return [url]
    base = urllib.parse.urlsplit(settings.RABBITMQ_URL)
    userinfo = base.netloc.rpartition("@")[0]
    urls = [settings.RABBITMQ_URL]
    for node in settings.RABBITMQ_NODES:
        netloc = f"{userinfo}@{node}" if userinfo else node
        urls.append(urllib.parse.urlunsplit(base._replace(netloc=netloc)))
    return urls


def cluster_parameters(vhost=None, url=None, **overrides):
    """One set of parameters per node (``node_urls``): a BlockingConnection given the list
    connects to the first node that answers; a SelectConnection takes them in turn."""
    return [amqp_parameters(vhost, node, **overrides) for node in node_urls(url)]


def connect(vhost=None, **overrides):
    overrides.setdefault("heartbeat", 30)
    overrides.setdefault("blocked_connection_timeout", 60)
    return pika.BlockingConnection(cluster_parameters(vhost, **overrides))
