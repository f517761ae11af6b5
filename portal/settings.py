"""Settings for Quartermaster, read from the environment.

With nothing set, everything runs on one machine with no server installed:
SQLite under var/, a Celery broker on the filesystem, the simulated cluster.
Set DATABASE_URL and REDIS_URL for PostgreSQL and Redis. Every secret may
come from a file instead: FOO_FILE=/run/secrets/foo.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from kombu.transport import TRANSPORT_ALIASES

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("QM_VAR_DIR", BASE_DIR / "var"))


def env(name: str, default: str = "") -> str:
    """Return NAME from the environment, or the contents of the file NAME_FILE."""
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={path} cannot be read: {exc}") from exc
    return os.environ.get(name, default)


def envbool(name: str, default: str) -> bool:
    value = env(name, default).lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, not {value!r}")


def envint(name: str, default: str) -> int:
    value = env(name, default)
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, not {value!r}") from None


def envlist(name: str, default: str) -> list[str]:
    return [item.strip() for item in env(name, default).split(",") if item.strip()]


DEBUG = envbool("DEBUG", "false")


def _local_secret_key() -> str:
    """A random key made once for this installation and kept in var/secret_key (0600), so that
    sessions survive restarts; never derived from anything another installation shares."""
    import secrets

    path = VAR_DIR / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    key = secrets.token_urlsafe(50)
    try:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()  # another process made it first
    except OSError:
        return key  # a read-only var/: this process's key, sessions end with it
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return key


SECRET_KEY = env("SECRET_KEY")
if not SECRET_KEY:
    # The image sets QM_REQUIRE_SECRET=true: a deployment without SECRET_KEY refuses to start
    # rather than sign sessions with a key an attacker could guess. A checkout (./scripts/run,
    # the tests) or a demo container (QM_DEMO=true) gets a random key of its own.
    if envbool("QM_REQUIRE_SECRET", "false") and not (DEBUG or envbool("QM_DEMO", "false")):
        raise ImproperlyConfigured(
            "SECRET_KEY (or SECRET_KEY_FILE) must be set; for a demo, set QM_DEMO=true"
        )
    SECRET_KEY = _local_secret_key()

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    "portal",
]

MIDDLEWARE = [
    # First, so that even a probe's or a refused request's answer carries the policies.
    "portal.middleware.SecurityHeadersMiddleware",
    "portal.middleware.ProbeMiddleware",
    # Errors under /api/ as problem details, whichever layer below answered them.
    "portal.middleware.ApiProblemMiddleware",
    "portal.middleware.BadInputMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Auditors are read-only: every unsafe method of theirs answers 403 (portal/access.py).
    "portal.access.ReadOnlyRoleMiddleware",
    # Last, as django-axes asks: it answers a locked-out login attempt.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    }
]

DATABASE_URL = env("DATABASE_URL")
DATABASES: dict[str, Any]
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": Path(env("SQLITE_PATH", str(VAR_DIR / "quartermaster.sqlite3"))),
            # A file, not memory, so that a test's Celery worker process can share it.
            "TEST": {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")},
            "OPTIONS": {
                # web, worker and beat share one file: wait for locks, write-ahead log,
                # take the write lock at BEGIN so a tick never deadlocks on upgrade.
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    # Counts failed password logins and refuses a locked-out client before checking the password.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Single sign-on (OpenID Connect, docs/portal.md): on when OIDC_RP_CLIENT_ID is set.
# Authorization-code flow with PKCE; endpoints are the provider's (its discovery document).
OIDC_RP_CLIENT_ID = env("OIDC_RP_CLIENT_ID")
OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
OIDC_RP_CLIENT_SECRET = env("OIDC_RP_CLIENT_SECRET")
OIDC_OP_AUTHORIZATION_ENDPOINT = env("OIDC_OP_AUTHORIZATION_ENDPOINT")
OIDC_OP_TOKEN_ENDPOINT = env("OIDC_OP_TOKEN_ENDPOINT")
OIDC_OP_USER_ENDPOINT = env("OIDC_OP_USER_ENDPOINT")
OIDC_OP_JWKS_ENDPOINT = env("OIDC_OP_JWKS_ENDPOINT")
OIDC_RP_SIGN_ALGO = env("OIDC_RP_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = env("OIDC_RP_SCOPES", "openid email profile groups")
OIDC_USE_PKCE = True
OIDC_PKCE_CODE_CHALLENGE_METHOD = "S256"
OIDC_TOKEN_USE_BASIC_AUTH = envbool("OIDC_TOKEN_USE_BASIC_AUTH", "false")
OIDC_VERIFY_SSL = envbool("OIDC_VERIFY_SSL", "true")
OIDC_TIMEOUT = envint("OIDC_TIMEOUT_SECONDS", "10")
OIDC_USERNAME_CLAIM = env("OIDC_USERNAME_CLAIM", "preferred_username")
OIDC_GROUPS_CLAIM = env("OIDC_GROUPS_CLAIM", "groups")
OIDC_CREATE_USER = envbool("OIDC_CREATE_USER", "true")
OIDC_PROVIDER_NAME = env("OIDC_PROVIDER_NAME", "single sign-on")
OIDC_AUTHENTICATE_CLASS = "portal.auth.sso.AuthenticateView"
OIDC_CALLBACK_CLASS = "portal.auth.sso.CallbackView"
LOGIN_REDIRECT_URL_FAILURE = "/accounts/login/?sso=failed"


def _group_map(raw: str) -> list[tuple[str, str, str]]:
    """OIDC_GROUP_MAP: `group:team:role,...`; role member, lead, admin or auditor; team `*`
    for the platform roles (admin, auditor), which belong to no team."""
    entries = []
    for item in (i.strip() for i in raw.split(",")):
        if not item:
            continue
        parts = item.split(":")
        if len(parts) != 3 or not all(parts):
            raise ImproperlyConfigured(f"OIDC_GROUP_MAP: {item!r} is not group:team:role")
        group, team, role = parts
        if role in ("admin", "auditor") and team != "*":
            raise ImproperlyConfigured(f"OIDC_GROUP_MAP: {item!r}: {role} takes the team *")
        if role in ("member", "lead") and team == "*":
            raise ImproperlyConfigured(f"OIDC_GROUP_MAP: {item!r}: {role} needs a team name")
        if role not in ("member", "lead", "admin", "auditor"):
            raise ImproperlyConfigured(
                f"OIDC_GROUP_MAP: {item!r}: role must be member, lead, admin or auditor"
            )
        entries.append((group, team, role))
    return entries


OIDC_GROUP_MAP = _group_map(env("OIDC_GROUP_MAP"))
if OIDC_ENABLED:
    _missing = [
        name
        for name in (
            "OIDC_OP_AUTHORIZATION_ENDPOINT",
            "OIDC_OP_TOKEN_ENDPOINT",
            "OIDC_OP_USER_ENDPOINT",
            "OIDC_OP_JWKS_ENDPOINT",
        )
        if not globals()[name]
    ]
    if _missing:
        raise ImproperlyConfigured(f"OIDC_RP_CLIENT_ID is set: also set {', '.join(_missing)}")
    AUTHENTICATION_BACKENDS.append("portal.auth.sso.GroupMappingBackend")
# PASSWORD_LOGIN=false leaves single sign-on as the only way in (API tokens still work).
PASSWORD_LOGIN = envbool("PASSWORD_LOGIN", "true")
if not PASSWORD_LOGIN:
    if not OIDC_ENABLED:
        raise ImproperlyConfigured("PASSWORD_LOGIN=false needs single sign-on (OIDC_RP_CLIENT_ID)")
    AUTHENTICATION_BACKENDS = ["portal.auth.sso.GroupMappingBackend"]
#: members of this Django group are auditors: they read what admins read and change nothing
AUDITOR_GROUP = env("AUDITOR_GROUP", "auditors")

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
CSRF_FAILURE_VIEW = "portal.views.errors.csrf_failure"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env("STATIC_ROOT", str(VAR_DIR / "static")))

# Security: production settings pass `manage.py check --deploy`.
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the page, not the cookie
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
#: script only from the portal's own files; inline style attributes only (the bar widths)
CONTENT_SECURITY_POLICY = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "style-src-attr": "'unsafe-inline'",
    "img-src": "'self' data:",
    "connect-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'none'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}
#: no page needs these browser features: none may be used, not even by the portal itself
PERMISSIONS_POLICY = {
    feature: ""
    for feature in (
        "accelerometer",
        "autoplay",
        "camera",
        "display-capture",
        "geolocation",
        "gyroscope",
        "magnetometer",
        "microphone",
        "midi",
        "payment",
        "usb",
    )
}
if not DEBUG and envbool("SECURE_COOKIES", "false"):
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", "true")
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", "31536000")
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]

# The cache holds the API throttles' counts, shared by every process: Redis when REDIS_URL is
# set (this process's memory while Redis cannot be reached: portal/lib/cache.py), else files
# under var/ (one machine).
REDIS_URL = env("REDIS_URL")
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "portal.lib.cache.FallbackRedisCache",
            "LOCATION": env("CACHE_URL", REDIS_URL),
            "KEY_PREFIX": "qm",
        }
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(VAR_DIR / "cache"),
        }
    }

# Password logins: after AXES_FAILURE_LIMIT failures for one username from one address, that
# pair is refused (429) for AXES_COOLOFF_MINUTES, whatever the password. Failures are counted in
# the database, which every replica shares (django-axes refuses a file or memory cache).
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_FAILURE_LIMIT = envint("AXES_FAILURE_LIMIT", "10")
AXES_COOLOFF_TIME = envint("AXES_COOLOFF_MINUTES", "15") / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_HTTP_RESPONSE_CODE = 429
AXES_VERBOSE = False
# a page of the portal that says how long to wait, with Retry-After
AXES_LOCKOUT_CALLABLE = "portal.views.me.locked_out"
AXES_CLIENT_IP_CALLABLE = "portal.api.guards.client_address"

# Celery: Redis when REDIS_URL is set, else a broker on the filesystem.
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "visibility_timeout": 3600,
        "socket_connect_timeout": 2,
        # A worker blocked reading a connection Redis dropped while it was away never notices
        # and stops consuming after Redis returns (celery/celery#8030): time reads out, check
        # the connection while idle, and retry the read on a timeout.
        "socket_timeout": 10,
        "socket_keepalive": True,
        "health_check_interval": 10,
        "retry_on_timeout": True,
    }
else:
    _broker = VAR_DIR / "broker"
    for _sub in ("in", "processed", "control"):
        (_broker / _sub).mkdir(parents=True, exist_ok=True)
    # kombu's filesystem transport, writing each message whole before a reader can see it
    # (docs/decisions.md), named in the URL so that the URL alone says which broker it is.
    # A host is named, or kombu warns in every process that it assumed one.
    TRANSPORT_ALIASES.setdefault("qmfs", "portal.lib.broker:Transport")
    CELERY_BROKER_URL = "qmfs://localhost//"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker / "in"),
        "data_folder_out": str(_broker / "in"),
        "data_folder_processed": str(_broker / "processed"),
        "store_processed": False,
        "control_folder": str(_broker / "control"),
        # The worker reads one message per poll: at the default 1 s, beat's tasks outpace it
        # and every task (a tick's launch included) waits longer and longer in the queue.
        "polling_interval": 0.1,
    }
CELERY_TASK_ALWAYS_EAGER = envbool("CELERY_TASK_ALWAYS_EAGER", "false")
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# The broker only wakes things up: a publish it refuses is given up quickly (the web's
# submit must not wait on it; beat's next tick does the work), and a worker or beat waits
# for it to come back however long it is away, instead of exiting.
CELERY_BROKER_CONNECTION_TIMEOUT = 2
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.2,
}
# Beat touches its heartbeat files (portal/lib/heartbeat.py), read by `manage.py probe`.
CELERY_BEAT_SCHEDULER = "portal.lib.heartbeat:HeartbeatScheduler"
#: where the worker and beat write their heartbeats (per pod: the chart's var volume)
HEARTBEAT_DIR = env("HEARTBEAT_DIR", str(VAR_DIR / "heartbeat"))

# Scheduling.
TICK_SECONDS = envint("TICK_SECONDS", "3")
CLUSTER_BACKEND = env("CLUSTER_BACKEND", "simulated")
if CLUSTER_BACKEND not in ("simulated", "kubernetes"):
    raise ImproperlyConfigured("CLUSTER_BACKEND must be simulated or kubernetes")
SIMULATED_CLUSTER = env("SIMULATED_CLUSTER", str(BASE_DIR / "portal" / "demo" / "cluster.yaml"))
# Simulated workloads run this many real seconds per requested hour (demo speed).
SIMULATED_SECONDS_PER_HOUR = envint("SIMULATED_SECONDS_PER_HOUR", "60")
#: how long a simulated node burn-in (validation) runs, wall seconds
SIMULATED_VALIDATION_SECONDS = envint("SIMULATED_VALIDATION_SECONDS", "3")
# An autoscaled pool's nodes appear this many seconds after they were asked for.
SIMULATED_PROVISIONING_SECONDS = envint("SIMULATED_PROVISIONING_SECONDS", "20")
# Checkpoint storage (docs/checkpoints.md): a folder per request on the simulated cluster,
# a PersistentVolumeClaim per request on Kubernetes ("" = the cluster's default class).
SIMULATED_CHECKPOINT_DIR = env("SIMULATED_CHECKPOINT_DIR", str(VAR_DIR / "checkpoints"))
# The simulated workloads' logs, a file each (docs/portal.md, "Logs and events").
SIMULATED_LOG_DIR = env("SIMULATED_LOG_DIR", str(VAR_DIR / "logs"))
CHECKPOINT_STORAGE_CLASS = env("CHECKPOINT_STORAGE_CLASS")
CHECKPOINT_SIZE = env("CHECKPOINT_SIZE", "50Gi")
CHECKPOINT_ACCESS_MODE = env("CHECKPOINT_ACCESS_MODE", "ReadWriteOnce")
if CHECKPOINT_ACCESS_MODE not in ("ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany"):
    raise ImproperlyConfigured(
        "CHECKPOINT_ACCESS_MODE must be ReadWriteOnce, ReadWriteOncePod or ReadWriteMany"
    )
if not re.fullmatch(r"[1-9][0-9]*(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?", CHECKPOINT_SIZE):
    raise ImproperlyConfigured(
        f"CHECKPOINT_SIZE must be a quantity such as 50Gi, not {CHECKPOINT_SIZE!r}"
    )
# Where workloads report checkpoints, as pods reach the portal; "" = K8S_PORTAL_URL.
CHECKPOINT_PORTAL_URL = env("CHECKPOINT_PORTAL_URL")
K8S_IN_CLUSTER = envbool("K8S_IN_CLUSTER", "false")
NODE_AGENT_TOKEN = env("NODE_AGENT_TOKEN")
HEARTBEAT_STALE_SECONDS = envint("HEARTBEAT_STALE_SECONDS", "120")
IMAGE_PULL_TIMEOUT_SECONDS = envint("IMAGE_PULL_TIMEOUT_SECONDS", "600")
METRICS_TOKEN = env("METRICS_TOKEN")
# Which web replica exports the database-derived metrics: the holder of a lease renewed at each
# scrape (portal/metrics/collector.py). METRICS_REPLICA names this replica (default: POD_NAME, hostname).
METRICS_REPLICA = env("METRICS_REPLICA")
METRICS_LEASE_SECONDS = envint("METRICS_LEASE_SECONDS", "90")
# The decision log keeps this many days; older rows are folded into counters and deleted.
DECISION_RETENTION_DAYS = envint("DECISION_RETENTION_DAYS", "90")
# Kubernetes backend (portal/backends/kubernetes.py; lists are comma-separated).
K8S_PORTAL_URL = env("K8S_PORTAL_URL")
K8S_READY_IMAGE = env("K8S_READY_IMAGE")
K8S_READY_TIMEOUT_SECONDS = envint("K8S_READY_TIMEOUT_SECONDS", "300")
K8S_BACKOFF_LIMIT = envint("K8S_BACKOFF_LIMIT", "2")
K8S_JOB_TTL_SECONDS = envint("K8S_JOB_TTL_SECONDS", "86400")
K8S_TERMINATION_GRACE_SECONDS = envint("K8S_TERMINATION_GRACE_SECONDS", "30")
K8S_RUN_AS_USER = envint("K8S_RUN_AS_USER", "1000")
K8S_RUN_AS_GROUP = envint("K8S_RUN_AS_GROUP", "1000")
K8S_FS_GROUP = envint("K8S_FS_GROUP", "1000")
K8S_RUNTIME_CLASS = env("K8S_RUNTIME_CLASS")
K8S_WORKLOAD_SERVICE_ACCOUNT = env("K8S_WORKLOAD_SERVICE_ACCOUNT")
K8S_ALLOWED_IMAGES = envlist("K8S_ALLOWED_IMAGES", "")
K8S_FAIL_EXIT_CODES = envlist("K8S_FAIL_EXIT_CODES", "137")
K8S_IMAGE_PULL_SECRETS = envlist("K8S_IMAGE_PULL_SECRETS", "")
K8S_POD_NAMESPACES = envlist("K8S_POD_NAMESPACES", "")
K8S_WATCH_NAMESPACES = envlist("K8S_WATCH_NAMESPACES", "")
#: keep nodes and non-terminal pods by watches in each worker process (docs/kubernetes.md);
#: false lists both on every reconcile instead
K8S_WATCH_INVENTORY = envbool("K8S_WATCH_INVENTORY", "true")
# Autoscaled pools' PodTemplates and ProvisioningRequests go here (docs/capacity.md).
K8S_PROVISIONING_NAMESPACE = env("K8S_PROVISIONING_NAMESPACE", "quartermaster")
#: offer MIG instances only where mig-manager reports `nvidia.com/mig.config.state=success`;
#: false for clusters that partition GPUs without mig-manager (the label never appears)
K8S_REQUIRE_MIG_CONFIG_STATE = envbool("K8S_REQUIRE_MIG_CONFIG_STATE", "true")
#: how a gang (a request of several pods) is launched (docs/kubernetes.md, "Gangs"): "jobset"
#: one JobSet (needs the JobSet CRD), "jobs" one Job per pod and a headless Service, "auto"
#: a JobSet where the API server serves jobset.x-k8s.io/v1alpha2 (asked once per process)
K8S_GANG_API = env("K8S_GANG_API", "auto")
if K8S_GANG_API not in ("auto", "jobs", "jobset"):
    raise ImproperlyConfigured(f"K8S_GANG_API must be auto, jobs or jobset, not {K8S_GANG_API!r}")
# Node validation (docs/lifecycle.md): the burn-in image, and the namespace its Jobs run in.
#: nccl-tests' all_reduce_perf (the main container); `dcgmi diag` runs first from the DCGM image
VALIDATION_IMAGE = env(
    "VALIDATION_IMAGE", "ghcr.io/coreweave/nccl-tests:12.8.1-devel-ubuntu22.04-nccl2.26.2-1-0708d2e"
)
VALIDATION_DCGM_IMAGE = env(
    "VALIDATION_DCGM_IMAGE", "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
)
#: burn-in thresholds (a rollout may ask for stricter ones): all-reduce bus bandwidth, GB/s,
#: at least; the `dcgmi diag -r` level (1-4)
VALIDATION_NCCL_MIN_BUSBW_GBPS = envint("VALIDATION_NCCL_MIN_BUSBW_GBPS", "100")
VALIDATION_DCGM_DIAG_LEVEL = envint("VALIDATION_DCGM_DIAG_LEVEL", "1")
if VALIDATION_DCGM_DIAG_LEVEL not in (1, 2, 3, 4):
    raise ImproperlyConfigured("VALIDATION_DCGM_DIAG_LEVEL must be 1, 2, 3 or 4")
#: a node back after this long not ready is burnt in again before it serves
BURN_IN_RETURN_AFTER_SECONDS = envint("BURN_IN_RETURN_AFTER_SECONDS", "3600")
#: how a driver rollout tells the GPU Operator the version (docs/lifecycle.md): "auto"
#: (NVIDIADriver where its CRD is served, else node labels), "nvidiadriver", "clusterpolicy",
#: "labels"; and the driver image an NVIDIADriver names
GPU_OPERATOR_DRIVER_API = env("GPU_OPERATOR_DRIVER_API", "auto")
if GPU_OPERATOR_DRIVER_API not in ("auto", "nvidiadriver", "clusterpolicy", "labels"):
    raise ImproperlyConfigured(
        "GPU_OPERATOR_DRIVER_API must be auto, nvidiadriver, clusterpolicy or labels, "
        f"not {GPU_OPERATOR_DRIVER_API!r}"
    )
GPU_OPERATOR_DRIVER_IMAGE = env("GPU_OPERATOR_DRIVER_IMAGE", "nvcr.io/nvidia/driver")
GPU_OPERATOR_DRIVER_REPOSITORY = env("GPU_OPERATOR_DRIVER_REPOSITORY", "")
# Where the GPU Operator runs its operands: a device-plugin rollout follows the plugin's pods there.
GPU_OPERATOR_NAMESPACE = env("GPU_OPERATOR_NAMESPACE", "gpu-operator")
VALIDATION_NAMESPACE = env("VALIDATION_NAMESPACE", "quartermaster-validation")
#: a burn-in with no result by then fails its node
VALIDATION_TIMEOUT_SECONDS = envint("VALIDATION_TIMEOUT_SECONDS", "1800")
#: MIG pools whose layout a rollout may change to the proposed one ("*": every MIG pool)
MIG_RELAYOUT_POOLS = envlist("MIG_RELAYOUT_POOLS", "")
REQUEUE_BASE_SECONDS = envint("REQUEUE_BASE_SECONDS", "60")
REQUEUE_MAX_SECONDS = envint("REQUEUE_MAX_SECONDS", "3600")
REQUEUE_LIMIT = envint("REQUEUE_LIMIT", "5")
# A launch the backend did not confirm is retried this many times in all, with backoff.
# Priority within a class band, bounded by role: members may only lower theirs, leads may
# raise it up to PRIORITY_MAX_LEAD, platform admins to 100 (docs/portal.md).
PRIORITY_MIN = envint("PRIORITY_MIN", "-100")
PRIORITY_MAX_MEMBER = envint("PRIORITY_MAX_MEMBER", "0")
PRIORITY_MAX_LEAD = envint("PRIORITY_MAX_LEAD", "50")
PRIORITY_MAX_ADMIN = envint("PRIORITY_MAX_ADMIN", "100")
LAUNCH_RETRY_LIMIT = envint("LAUNCH_RETRY_LIMIT", "5")
LAUNCH_RETRY_BASE_SECONDS = envint("LAUNCH_RETRY_BASE_SECONDS", "10")
LAUNCH_RETRY_MAX_SECONDS = envint("LAUNCH_RETRY_MAX_SECONDS", "300")
MAX_PENDING_PER_USER = envint("MAX_PENDING_PER_USER", "50")
MAX_PENDING_PER_TEAM = envint("MAX_PENDING_PER_TEAM", "500")
DEMO_TRICKLE = envbool("DEMO_TRICKLE", "false")
#: the login page lists the demo's logins: [[username, what they are], ...] and their password
#: (set by `manage.py up` when it seeds the demo; nothing is listed elsewhere)
DEMO_LOGINS: list[list[str]] = json.loads(env("DEMO_LOGINS", "[]"))
DEMO_PASSWORD = env("DEMO_PASSWORD", "")

# Notifications (portal/services/notify.py): email through Django's backend, webhooks as {"text": ...}.
EMAIL_BACKEND = env("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env("EMAIL_HOST", "localhost")
EMAIL_PORT = envint("EMAIL_PORT", "25")
EMAIL_HOST_USER = env("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", "false")
EMAIL_USE_SSL = envbool("EMAIL_USE_SSL", "false")
EMAIL_TIMEOUT = envint("EMAIL_TIMEOUT", "10")
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", "quartermaster@localhost")
# Where links in notifications point ("" = no link).
PORTAL_URL = env("PORTAL_URL")
# A request pending longer than this gets one "still waiting" notification.
NOTIFY_LONG_WAIT_SECONDS = envint("NOTIFY_LONG_WAIT_SECONDS", "3600")
NOTIFY_WEBHOOK_TIMEOUT_SECONDS = envint("NOTIFY_WEBHOOK_TIMEOUT_SECONDS", "5")
# Webhooks to loopback, private and link-local addresses are refused unless this is set.
NOTIFY_WEBHOOK_ALLOW_PRIVATE = envbool("NOTIFY_WEBHOOK_ALLOW_PRIVATE", "false")
# ... or, finer, unless they fall in one of these networks (an on-premises chat server).
NOTIFY_WEBHOOK_ALLOWED_NETWORKS = envlist("NOTIFY_WEBHOOK_ALLOWED_NETWORKS", "")
# CA bundle that https webhooks are verified against ("" = the system's).
NOTIFY_WEBHOOK_CA_FILE = env("NOTIFY_WEBHOOK_CA_FILE")

# Personal access tokens (/me/tokens/, /api/v1/tokens/): the expiry offered by default, and
# the longest a user may choose, in days.
PERSONAL_TOKEN_DAYS = envint("PERSONAL_TOKEN_DAYS", "90")
PERSONAL_TOKEN_MAX_DAYS = envint("PERSONAL_TOKEN_MAX_DAYS", "365")
if not 1 <= PERSONAL_TOKEN_DAYS <= PERSONAL_TOKEN_MAX_DAYS:
    raise ImproperlyConfigured("PERSONAL_TOKEN_DAYS must be between 1 and PERSONAL_TOKEN_MAX_DAYS")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.auth.tokens.PersonalTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "portal.api.guards.ReadOnlyRolePermission",
        "portal.api.guards.TokenScopePermission",
    ],
    "DEFAULT_SCHEMA_CLASS": "portal.api.schema.PortalAutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    # JSON only: the pages post forms to their own views, not to the API.
    "DEFAULT_PARSER_CLASSES": ["portal.api.guards.SafeJSONParser"],
    "DEFAULT_THROTTLE_CLASSES": [
        "portal.api.guards.AnonThrottle",
        "portal.api.guards.UserThrottle",
        "portal.api.guards.TokenThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {
        "anon": env("THROTTLE_ANON", "60/min"),
        "user": env("THROTTLE_USER", "600/min"),
        "token": env("THROTTLE_TOKEN", "600/min"),
    },
    # Behind the chart's Ingress the client address is the last hop of X-Forwarded-For.
    # 0 means no proxy: the socket's address, X-Forwarded-For ignored (DRF reads None as
    # "trust the whole header", which any client can spoof).
    "NUM_PROXIES": envint("NUM_PROXIES", "0"),
    "EXCEPTION_HANDLER": "portal.api.guards.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Quartermaster API",
    "DESCRIPTION": "Request GPUs, watch the queue, manage quotas.",
    "VERSION": "1",
    # Swagger UI and ReDoc from the installed drf-spectacular-sidecar: no CDN, works offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # a request's kind (submit and preview alike), apart from a device profile's kind
    "ENUM_NAME_OVERRIDES": {"WorkloadKindEnum": ["batch", "serving"]},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"client_errors_quiet": {"()": "portal.lib.logs.ClientErrorsQuiet"}},
    "formatters": {"line": {"format": "[%(asctime)s: %(levelname)s/%(name)s] %(message)s"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "line",
            "filters": ["client_errors_quiet"],
        }
    },
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# Serving workloads (docs/serving.md, docs/metrics.md)
#: the simulated cluster runs a synthetic model server process per serving replica
SIMULATED_SERVING_PROCESSES = env("SIMULATED_SERVING_PROCESSES", "1") == "1"
SIMULATED_SERVING_WARMUP_S = float(env("SIMULATED_SERVING_WARMUP_S", "3"))
#: offered load of each simulated replica, requests per second
SIMULATED_SERVING_RPS = float(env("SIMULATED_SERVING_RPS", "2"))
#: Prometheus's HTTP API ("" = read the portal's own stored samples)
PROMETHEUS_URL = env("PROMETHEUS_URL", "")
PROMETHEUS_TIMEOUT_S = float(env("PROMETHEUS_TIMEOUT_S", "5"))
#: how the portal authenticates to it (docs/kubernetes.md, "GPU metrics"): a bearer token
#: file (read at each query) or basic auth (PROMETHEUS_PASSWORD, or PROMETHEUS_PASSWORD_FILE)
PROMETHEUS_BEARER_TOKEN_FILE = env("PROMETHEUS_BEARER_TOKEN_FILE", "")
PROMETHEUS_USERNAME = env("PROMETHEUS_USERNAME", "")
PROMETHEUS_PASSWORD = env("PROMETHEUS_PASSWORD", "")
if PROMETHEUS_BEARER_TOKEN_FILE and PROMETHEUS_USERNAME:
    raise ImproperlyConfigured(
        "set PROMETHEUS_BEARER_TOKEN_FILE or PROMETHEUS_USERNAME (basic auth), not both"
    )
#: a PEM bundle to verify an https PROMETHEUS_URL with (empty: the system's CAs)
PROMETHEUS_CA_FILE = env("PROMETHEUS_CA_FILE", "")
#: extra headers on every query, "Name=value,Name=value", e.g. "X-Scope-OrgID=gpu-cluster"
PROMETHEUS_HEADERS = env("PROMETHEUS_HEADERS", "")
#: raw per-minute device samples are kept this long, then only their rollups
UTILIZATION_RAW_HOURS = envint("UTILIZATION_RAW_HOURS", "2")
#: 5-minute rollups are kept this long (the 24 h charts)
UTILIZATION_5M_DAYS = envint("UTILIZATION_5M_DAYS", "2")
#: hourly rollups are kept this long (the 7 d and 30 d charts)
UTILIZATION_1H_DAYS = envint("UTILIZATION_1H_DAYS", "35")
#: serving samples (the fallback request-path history) are kept this long
SERVING_SAMPLE_DAYS = envint("SERVING_SAMPLE_DAYS", "7")
