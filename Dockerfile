# The Quartermaster portal image: web (gunicorn), worker and beat (celery), the migration Job
# and the readiness init container of generated Jobs all run it (charts/quartermaster).
#
#   docker build -t ghcr.io/quartermaster/portal:0.1.0 .
#
# Dependencies are pinned by requirements.lock (regenerate: scripts/lock-requirements).
# The user is 1000:1000, as the chart's securityContext; the root filesystem may be read-only
# (the chart mounts /var/lib/quartermaster and /tmp).

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY requirements.lock ./
RUN pip install --no-deps -r requirements.lock
COPY manage.py pyproject.toml README.md ./
COPY portal ./portal
COPY scheduling ./scheduling
COPY templates ./templates
COPY static ./static
# Static files are collected into the image: the chart's /var/lib/quartermaster is an emptyDir.
RUN STATIC_ROOT=/app/staticfiles QM_VAR_DIR=/tmp/qm python manage.py collectstatic --noinput \
    && python -m compileall -q portal scheduling

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DJANGO_SETTINGS_MODULE=portal.settings \
    STATIC_ROOT=/app/staticfiles \
    QM_VAR_DIR=/var/lib/quartermaster \
    QM_REQUIRE_SECRET=true
RUN groupadd --gid 1000 quartermaster \
    && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin quartermaster \
    && mkdir -p /var/lib/quartermaster \
    && chown 1000:1000 /var/lib/quartermaster
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
WORKDIR /app
USER 1000:1000
EXPOSE 8000
CMD ["gunicorn", "portal.wsgi", "--bind", "0.0.0.0:8000", "--workers", "4", "--access-logfile", "-"]
