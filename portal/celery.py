import os

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_finalize.connect
def _schedule_tick(sender: Celery, **kwargs: object) -> None:
    from django.conf import settings

    sender.add_periodic_task(
        float(settings.TICK_SECONDS), sender.signature("portal.tasks.tick"), name="tick"
    )
    sender.add_periodic_task(
        float(settings.TICK_SECONDS), sender.signature("portal.tasks.reconcile"), name="reconcile"
    )
    sender.add_periodic_task(
        3600.0, sender.signature("portal.tasks.decisions_prune"), name="decisions-prune"
    )
    if settings.DEMO_TRICKLE:
        sender.add_periodic_task(
            4.0, sender.signature("portal.tasks.demo_trickle"), name="demo-trickle"
        )


@worker_ready.connect
def _start_watching(sender: object, **kwargs: object) -> None:
    """On a real cluster, watch Jobs and Pods so endings are classified even after pods are gone."""
    from django.conf import settings

    if settings.CLUSTER_BACKEND == "kubernetes":
        import threading

        from portal.backends import get_backend

        # Daemon threads: they end with the worker process.
        get_backend().start_watching(threading.Event())
