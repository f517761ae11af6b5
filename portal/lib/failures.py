"""The one line of a workload's log that says why it failed: a Python exception, a CUDA or NCCL
error, an `Error:` line, an out-of-memory kill."""

from __future__ import annotations

import re

#: how far back from the end of the log the line is looked for
SCAN_LINES = 200
#: the longest line a summary quotes
MAX_CHARS = 200

# Lines that repeat what the exit code says already: never the reason.
_NOISE = re.compile(r"exited with (exit )?code \d+|^\[qm\]", re.IGNORECASE)
# The last line of a Python traceback: `module.SomeError: message` (or the bare name).
_EXCEPTION = re.compile(
    r"^([A-Za-z_][\w]*\.)*[A-Za-z_]\w*(Error|Exception|Exit|Interrupt|Fault|Killed)\b(:.*)?$"
)
_CUDA = re.compile(
    r"CUDA (error|out of memory)|cudaError|CUBLAS_STATUS|CUDNN_STATUS|NCCL (error|WARN)|"
    r"ncclInternalError|ncclSystemError|Xid \d+",
    re.IGNORECASE,
)
_OOM = re.compile(r"\bOOMKilled\b|\bout of memory\b|^Killed$", re.IGNORECASE)
_ERROR = re.compile(r"(^|\s|\])(error|fatal|panic)(:|\s\[)", re.IGNORECASE)


def error_line(log: str) -> str | None:
    """The last line of the log's tail that names an error, stripped and cut to MAX_CHARS;
    None when no line does (the exit code is then all there is to say)."""
    lines = [line.strip() for line in log.splitlines()[-SCAN_LINES:]]
    for pattern in (_EXCEPTION, _CUDA, _OOM, _ERROR):
        for line in reversed(lines):
            if line and not _NOISE.search(line) and pattern.search(line):
                return line[:MAX_CHARS]
    return None
