"""Writing files so that a crash, a full disk or a reader never sees half of one, and
telling apart the file-system errors a user can act on (free space, fix permissions)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

# Errors of the file system a user can act on: reported in one line, not as a traceback.
USER_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
# The same errors as libraries re-raise them as text (orbax wraps them in its own types).
USER_ERROR_TEXT = ("No space left on device", "Disk quota exceeded", "Read-only file system", "Permission denied")

# The permissions a plain `open(path, "w")` would give: mkstemp makes its file 0600, and
# a replaced file should read like every other file of the run folder (0644 under the
# usual umask). Read once, at import, while no other thread can change the umask.
_UMASK = os.umask(0)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK


def is_user_fs_error(e: BaseException) -> bool:
    """Whether ``e`` is a full disk, a quota, a read-only file system or a permission."""
    return (isinstance(e, OSError) and e.errno in USER_ERRNOS) or any(t in str(e) for t in USER_ERROR_TEXT)


def fs_error_text(e: BaseException) -> str:
    """``e`` in a few words for an ``error:`` line."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = next((t for t in USER_ERROR_TEXT if t in str(e)), None)
    return text or f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` in one step (temporary file, fsync, rename), so a reader (or a
    crash) never sees half a file and a failed write leaves the old one in place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), FILE_MODE)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
