"""Read a text file the user named (an inventory, a hostfile), refusing what cannot be one.

A path on the command line may name anything: a FIFO that nobody writes (opening it
would block forever), ``/dev/zero`` or ``/dev/urandom`` (reading would never end), a
file of gigabytes, or bytes that are not text. Each of these becomes one
:class:`InventoryError` naming the path and what to do, before much is read.
"""

from __future__ import annotations

import os
import stat

from clusterrun.errors import InventoryError

#: Largest file read; an inventory of thousands of nodes is well under a megabyte.
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_FILE_LABEL = "4 MiB"


def read_text_file(path: str | os.PathLike[str], what: str, missing: str) -> str:
    """The UTF-8 text of the regular file ``path``; ``what`` names it in messages ("inventory").

    Returns the text.
    Raises :class:`InventoryError` naming ``path`` when it does not exist (``missing`` is then
    the message after the path: what is missing and what to do), is a directory, a FIFO, a
    device or a socket (checked before opening), is larger than :data:`MAX_FILE_BYTES`, is
    not UTF-8 (naming the line and column of the first bad byte), or cannot be read.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InventoryError(f"{path}: {missing}") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise InventoryError(f"{path}: cannot read the {what}: {_reason(exc)}") from None
    if stat.S_ISDIR(info.st_mode):
        raise InventoryError(f"{path}: is a directory, not {_article(what)}; give the path of the {what} file")
    if not stat.S_ISREG(info.st_mode):
        raise _special(path, info.st_mode, what)
    if info.st_size > MAX_FILE_BYTES:
        raise _too_large(path, what, info.st_size)
    try:
        # O_NONBLOCK: should the path have become a FIFO since the stat, opening it must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read the {what}: {_reason(exc)}") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise _special(path, mode, what)
        try:
            data = f.read(MAX_FILE_BYTES + 1)  # one byte more tells a file that grew past the limit
        except OSError as exc:
            raise InventoryError(f"{path}: cannot read the {what}: {_reason(exc)}") from None
    if len(data) > MAX_FILE_BYTES:
        raise _too_large(path, what, len(data))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InventoryError(f"{path}:{line}:{column}: byte 0x{data[exc.start]:02x} is not UTF-8 text; "
                             f"save the {what} as UTF-8") from None


def _special(path: str | os.PathLike[str], mode: int, what: str) -> InventoryError:
    kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a special file")
    return InventoryError(f"{path}: is {kind}, not a regular file; write the {what} to a file and give that "
                          "file's path")


def _too_large(path: str | os.PathLike[str], what: str, size: int) -> InventoryError:
    return InventoryError(f"{path}: is {size} bytes, more than the {MAX_FILE_LABEL} clusterrun reads for "
                          f"{_article(what)}; check that this is the right file")


def _article(what: str) -> str:
    return f"an {what}" if what[:1] in "aeiou" else f"a {what}"


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
