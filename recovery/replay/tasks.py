"""Celery tasks of the replay engine (autodiscovered by console/celery.py).

Jobs run in ordinary workers (``celery -A console worker``); no separate replay daemon. A job's
task is acknowledged when it starts (not ``acks_late``): a job may run for hours, longer than
RabbitMQ lets a delivery stay unacked, and crash recovery does not need the task message — the
job's lease does. ``resume_stalled_jobs`` (Celery beat) re-enqueues a job whose runner stopped
renewing its lease (kill -9, a lost machine), and the new runner takes over its claims.
"""

import logging

from celery import shared_task
from celery.signals import worker_shutting_down

from recovery.old_task_names import formerly
from recovery.replay import jobs
from recovery.replay.runner import SHUTDOWN, JobRunner

log = logging.getLogger(__name__)


@shared_task(name="recovery.replay.tasks.run_replay_job", acks_late=False, ignore_result=True)
@formerly("recovery.tasks.run_replay_job", acks_late=False, ignore_result=True)
def run_replay_job(job_id, token=None, paced=False):
    """Run one replay job until it is done, paused, cancelled or handed back (shutdown, or a
    slow rate's wait: ``paced`` says this run's first message is due).

    ``token`` must match the job's: a task sent by a deployment with another database (same
    RabbitMQ) never runs an unrelated job that happens to have the same id.
    """
    outcome = JobRunner(job_id, token, paced=paced).run()
    log.info("replay job %s: %s", job_id, outcome)
    return outcome


@shared_task(name="recovery.replay.tasks.resume_stalled_jobs", ignore_result=True)
@formerly("recovery.tasks.resume_stalled_jobs", ignore_result=True)
def resume_stalled_jobs():
    return jobs.resume_stalled_jobs()


@worker_shutting_down.connect
def hand_back_jobs(**_kwargs):
    """A warm shutdown: runners in this process stop sending, settle what is in flight and put
    their job back in the queue for another worker. (Prefork pool children do not see this
    signal; their jobs finish, or are taken over after REPLAY_LEASE_SECONDS if killed.)"""
    SHUTDOWN.set()
