import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _schedule_tick(sender: Celery, **kwargs: object) -> None:
    from django.conf import settings

    every = float(settings.TICK_SECONDS)
    # A periodic tick still queued when the next one is sent has nothing left to do: it expires
    # instead of piling up behind a worker that a busy machine slowed down.
    fresh = {"expires": 2 * every}
    sender.add_periodic_task(every, sender.signature("portal.tasks.tick"), name="tick", **fresh)
    sender.add_periodic_task(
        every, sender.signature("portal.tasks.reconcile"), name="reconcile", **fresh
    )
    sender.add_periodic_task(
        3600.0, sender.signature("portal.tasks.decisions_prune"), name="decisions-prune"
    )
    sender.add_periodic_task(
        60.0, sender.signature("portal.tasks.notify_long_waits"), name="notify-long-waits"
    )
    sender.add_periodic_task(
        15.0, sender.signature("portal.tasks.serving_sample"), name="serving-sample"
    )
    sender.add_periodic_task(60.0, sender.signature("portal.tasks.utilization"), name="utilization")
    sender.add_periodic_task(
        every, sender.signature("portal.tasks.rollouts_tick"), name="rollouts-tick", **fresh
    )
    if settings.DEMO_TRICKLE:
        sender.add_periodic_task(
            4.0, sender.signature("portal.tasks.demo_trickle"), name="demo-trickle"
        )


# Connected by a call rather than as a decorator: Celery is untyped, and a decorator from it
# would make the function untyped for mypy (connect(fun) is what the decorator does).
app.on_after_finalize.connect(_schedule_tick)


# The Kubernetes backend watches Jobs and pods from the process that asks for a status: each
# prefork child starts its own watch on its first reconcile (KubernetesBackend.auto_watch),
# since threads started before the fork do not run in the children.
