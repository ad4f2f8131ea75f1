"""The one downloader behind ``--download`` (ogb's and DGL's own are replaced by it while they run), and the
quiet switch for third-party output.

:func:`fetch` gets one URL into one file: an HTTP error status is one :class:`DownloadError` line with the URL
and the status (a 4xx is not retried: asking again gets the same answer); a network error or a 5xx is tried
``ATTEMPTS`` times in all, and the message says so. A partial file is never left behind.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Iterator

from .._files import atomic_write
from ..errors import WriteError

__all__ = ["ATTEMPTS", "DownloadError", "fetch", "quiet_output"]

ATTEMPTS = 3
_CHUNK = 1 << 20


class DownloadError(ValueError):
    """A download failed; the message is one line with the URL, what went wrong and the attempts made."""


@contextlib.contextmanager
def quiet_output(quiet: bool) -> Iterator[None]:
    """With ``quiet``, whatever Python code prints to stdout or stderr inside the block (ogb's and DGL's
    messages and progress bars) is dropped; exceptions still propagate."""
    if not quiet:
        yield
        return
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def fetch(url: str, path: str, attempts: int = ATTEMPTS, quiet: bool = False, timeout: float = 60.0,
          wait: float = 1.0) -> str:
    """Download ``url`` to ``path`` (written atomically, :func:`~dgl_exact._files.atomic_write`); returns
    ``path``. Progress ("Downloading URL", "Downloaded X MB") on stdout/stderr unless ``quiet``. A failure to
    write locally (disk full, ...) is not retried: one :class:`~dgl_exact.errors.WriteError`."""
    last = ""
    for attempt in range(1, attempts + 1):
        try:
            if not quiet:
                print(f"Downloading {url}" + (f" (attempt {attempt} of {attempts})" if attempt > 1 else ""))
            with urllib.request.urlopen(url, timeout=timeout) as response, atomic_write(path, shared=True) as out:
                total = int(response.headers.get("Content-Length") or 0)
                done = 0
                while True:
                    chunk = response.read(_CHUNK)
                    if not chunk:
                        break
                    out.write(chunk)
                    done += len(chunk)
                    if not quiet:
                        size = f" of {total / 1e6:,.1f}" if total else ""
                        print(f"\rDownloaded {done / 1e6:,.1f}{size} MB", end="", file=sys.stderr, flush=True)
                if not quiet:
                    print(file=sys.stderr)
                if total and done != total:
                    raise urllib.error.URLError(f"connection closed after {done:,} of {total:,} bytes")
            return path
        except WriteError:  # the network did its part: retrying would fail the same way
            raise
        except urllib.error.HTTPError as err:
            last = f"HTTP {err.code} {err.reason}".strip()
            if err.code < 500:
                raise DownloadError(f"download of {url} failed: the server answered {last} (attempt {attempt} of "
                                    f"{attempts}; not retried: the answer would be the same)") from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", None) or err
            last = f"{type(err).__name__}: {reason}"
        if attempt < attempts:
            time.sleep(wait * attempt)
    raise DownloadError(f"download of {url} failed after {attempts} attempts (last: {last}); check the URL and "
                        "the network, then rerun with --download")
