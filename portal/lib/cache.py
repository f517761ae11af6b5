"""The shared cache: Redis, or this process's memory while Redis cannot be reached.

What the portal keeps in the cache (the API throttles' counts, the serving
samples' previous reading) may be lost or counted per process for a while
without harm, so a Redis outage must not fail a request. The first call that
finds Redis unreachable logs a warning and switches the process to a local
memory cache; Redis is tried again every `RETRY_SECONDS`, and the first call
that reaches it again logs that and switches back. Counts made meanwhile stay
in the process that made them (a throttle is per process for the outage).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: seconds between tries of an unreachable Redis (each try costs a refused connection at most)
RETRY_SECONDS = 5.0
#: Redis's connect and read timeouts, seconds: a cache call must not hold a request for long
SOCKET_TIMEOUT_SECONDS = 0.5


class _State:
    """One Redis server's outage, as this process sees it."""

    def __init__(self) -> None:
        self.down_since: float | None = None
        self.retry_at = 0.0
        self.lock = threading.Lock()


_states: dict[str, _State] = {}
_states_lock = threading.Lock()


class FallbackRedisCache(RedisCache):
    """Django's Redis cache that degrades to local memory (see the module docstring)."""

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        options = dict(params.get("OPTIONS", {}))
        options.setdefault("socket_connect_timeout", SOCKET_TIMEOUT_SECONDS)
        options.setdefault("socket_timeout", SOCKET_TIMEOUT_SECONDS)
        super().__init__(server, {**params, "OPTIONS": options})
        # Django makes one cache object per thread: the outage's state and the memory that
        # stands in for Redis are the process's, so it logs once and counts in one place.
        with _states_lock:
            self._state = _states.setdefault(str(server), _State())
        self._local = LocMemCache(f"fallback:{server}", {"OPTIONS": {"MAX_ENTRIES": 10000}})

    @property
    def redis_down(self) -> bool:
        return self._state.down_since is not None

    def _run(self, redis_call: Callable[[], _T], local_call: Callable[[], _T]) -> _T:
        state = self._state
        if state.down_since is not None and time.monotonic() < state.retry_at:
            return local_call()
        try:
            result = redis_call()
        except (RedisError, OSError) as exc:
            self._went_down(exc)
            return local_call()
        if state.down_since is not None:
            self._came_back()
        return result

    def _went_down(self, exc: Exception) -> None:
        state = self._state
        with state.lock:
            now = time.monotonic()
            state.retry_at = now + RETRY_SECONDS
            if state.down_since is None:
                state.down_since = now
                log.warning(
                    "Redis cache unreachable (%s: %s): using this process's memory, retrying every %.0f s",
                    type(exc).__name__,
                    exc,
                    RETRY_SECONDS,
                )

    def _came_back(self) -> None:
        state = self._state
        with state.lock:
            if state.down_since is None:
                return
            log.warning(
                "Redis cache reachable again after %.1f s: using it again",
                time.monotonic() - state.down_since,
            )
            state.down_since = None
            self._local.clear()

    def add(
        self,
        key: Any,
        value: Any,
        timeout: float | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> bool:
        return self._run(
            lambda: super(FallbackRedisCache, self).add(key, value, timeout, version),
            lambda: self._local.add(key, value, timeout, version),
        )

    def get(self, key: Any, default: Any | None = None, version: int | None = None) -> Any:
        return self._run(
            lambda: super(FallbackRedisCache, self).get(key, default, version),
            lambda: self._local.get(key, default, version),
        )

    def set(
        self,
        key: Any,
        value: Any,
        timeout: float | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> None:
        self._run(
            lambda: super(FallbackRedisCache, self).set(key, value, timeout, version),
            lambda: self._local.set(key, value, timeout, version),
        )

    def touch(
        self, key: Any, timeout: float | None = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        return self._run(
            lambda: super(FallbackRedisCache, self).touch(key, timeout, version),
            lambda: self._local.touch(key, timeout, version),
        )

    def delete(self, key: Any, version: int | None = None) -> bool:
        return self._run(
            lambda: super(FallbackRedisCache, self).delete(key, version),
            lambda: self._local.delete(key, version),
        )

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        keys = list(keys)
        return self._run(
            lambda: super(FallbackRedisCache, self).get_many(keys, version),
            lambda: self._local.get_many(keys, version),
        )

    def has_key(self, key: Any, version: int | None = None) -> bool:
        return self._run(
            lambda: super(FallbackRedisCache, self).has_key(key, version),
            lambda: self._local.has_key(key, version),
        )

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return self._run(
            lambda: super(FallbackRedisCache, self).incr(key, delta, version),
            lambda: self._local.incr(key, delta, version),
        )

    def set_many(
        self,
        data: dict[Any, Any],
        timeout: float | None = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> list[Any]:
        return self._run(
            lambda: super(FallbackRedisCache, self).set_many(data, timeout, version),
            lambda: self._local.set_many(data, timeout, version),
        )

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        keys = list(keys)
        self._run(
            lambda: super(FallbackRedisCache, self).delete_many(keys, version),
            lambda: self._local.delete_many(keys, version),
        )

    def clear(self) -> None:
        self._local.clear()
        self._run(lambda: super(FallbackRedisCache, self).clear(), lambda: None)
