"""Logging for people reading a terminal: a client's 403 or 404 is a line, not a traceback."""

from __future__ import annotations

import logging


class ClientErrorsQuiet(logging.Filter):
    """Django logs every 4xx as a warning with the exception's traceback attached (a 404 raised
    by a view, a 403 from a permission check). Those are the client's mistakes, not the portal's:
    keep one INFO line for them and leave warnings and tracebacks to what went wrong here."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if record.name == "django.request" and isinstance(status, int) and status < 500:
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True
