"""The no-op job each peer runs, defined the way each peer wants it.

Every peer is imported lazily, inside the function that needs it, so the
reference queue's part of the benchmark runs without any peer installed.
The broker URL comes from BENCH_REDIS_URL, set by the runner for its workers.
"""

from __future__ import annotations

import os


def noop() -> None:
    """The job: nothing, so the queue's own cost is all that is measured."""


def url() -> str:
    return os.environ["BENCH_REDIS_URL"]


def celery_url(redis_url: str) -> str:
    """Celery (kombu) spells a Unix-socket Redis as redis+socket://PATH."""
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url[len("unix://"):]
    return redis_url


def celery_app():
    from celery import Celery

    app = Celery("bench", broker=celery_url(url()))
    app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1,
                    task_ignore_result=True, result_backend=None,
                    broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False)
    app.task(name="bench.noop", acks_late=True, ignore_result=True)(noop)
    return app


def huey_app():
    from huey import RedisHuey

    h = RedisHuey("bench", url=url(), results=False)
    return h, h.task(name="bench.noop")(noop)


def dramatiq_actor():
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.middleware import default_middleware

    broker = RedisBroker(url=url(), middleware=[m() for m in default_middleware])
    dramatiq.set_broker(broker)
    return broker, dramatiq.actor(noop, actor_name="bench_noop", queue_name="bench")
