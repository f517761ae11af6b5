"""The scheduling core: pure Python, no Django, Celery or Kubernetes.

`schedule(snapshot, now_ms, policy)` takes frozen plain data and returns decisions.
"""

from scheduling.cycle import schedule

__all__ = ["schedule"]
