"""The one reader of run files: every file the harness or the analysis reads from a results folder
(``summary.json``, ``metrics.parquet``, ``config.yaml``, checkpoints, the analysis's own records,
Hydra job outcomes) goes through here, with one set of checks:

* **regular files only**: the file is opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked with
  ``fstat`` on the open descriptor, so a symlink (a loop included) is refused without being
  followed, and a FIFO or a device (``/dev/zero``) is refused without a read that would block or
  never end;
* **size bounds**: at most ``limit`` bytes (:data:`JSON_LIMIT`, :data:`TABLE_LIMIT`, ...) are read;
  a larger file is refused before it is read;
* **depth bounds**: JSON nested deeper than :data:`MAX_DEPTH` is refused (Python's parser would
  raise ``RecursionError`` far deeper, or run out of stack);
* **schema checks**: a metric table with a duplicated column name, or a registered column
  (:data:`harness.io.schema.METRIC_COLUMNS`) of a type it cannot hold, is refused.

Every refusal is a :class:`RunFileError` (a ``ValueError``) whose message names the file and says
what is wrong in one line; callers name the file and leave the run out (analysis) or redo it
(harness). Nothing is executed or unpickled: JSON, YAML through the safe loader, Parquet through
Arrow, safetensors.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

import pyarrow as pa

__all__ = ["RunFileError", "read_bytes", "read_json", "loads_json", "read_yaml", "read_table", "check_schema",
           "JSON_LIMIT", "YAML_LIMIT", "TABLE_LIMIT", "MAX_DEPTH"]

JSON_LIMIT = 64 << 20     # summary.json, outcome.json, the analysis's records: a few kB in practice
YAML_LIMIT = 16 << 20     # config.yaml: a few kB
TABLE_LIMIT = 4 << 30     # metrics.parquet: ~100 bytes per row; 4 GiB is tens of millions of iterations
MAX_DEPTH = 64            # our JSON documents nest at most 5 levels


class RunFileError(ValueError):
    """A run file that cannot be used; the message names the file and the reason in one line."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path: str | os.PathLike, limit: int | None) -> bytes:
    """The bytes of the regular file ``path`` (not a symlink, FIFO, device or directory), at most
    ``limit`` bytes (None: no bound; the checkpoint, whose size the trainer knows, checks its own).
    ``FileNotFoundError`` when there is no such entry, so callers can tell "not written yet" from
    "unusable"; :class:`RunFileError` for everything else."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW on a symlink (or a loop of them)
            raise RunFileError(path, "is a symlink (not followed: run files must be regular files)") from None
        raise RunFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RunFileError(path, f"is {_kind(st.st_mode)}, not a regular file")
        if limit is not None and st.st_size > limit:
            raise RunFileError(path, f"is {st.st_size} bytes, over the {limit}-byte bound for this file")
        chunks, total = [], 0
        while True:  # to its end: the file may have grown since fstat, still within the bound
            chunk = os.read(fd, max(st.st_size - total, 1 << 16))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
            if limit is not None and total > limit:
                raise RunFileError(path, f"is over the {limit}-byte bound for this file")
    except OSError as exc:
        raise RunFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _depth(obj: Any) -> int:
    """The nesting depth of a parsed JSON value (0 for a scalar), without recursion."""
    deepest, stack = 0, [(obj, 0)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            deepest = max(deepest, d + 1)
            if d + 1 > MAX_DEPTH:
                return d + 1
            stack.extend((x, d + 1) for x in node if isinstance(x, (dict, list)))
    return deepest


def loads_json(text: str | bytes, where: str | os.PathLike) -> Any:
    """``json.loads`` with the depth bound; :class:`RunFileError` naming ``where`` on any failure."""
    try:
        obj = json.loads(text)
    except RecursionError:
        raise RunFileError(where, f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise RunFileError(where, f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    if _depth(obj) > MAX_DEPTH:
        raise RunFileError(where, f"JSON nested deeper than {MAX_DEPTH} levels")
    return obj


def read_json(path: str | os.PathLike, limit: int | None = None) -> Any:
    """A JSON file through :func:`read_bytes` (at most ``limit`` bytes, default :data:`JSON_LIMIT`)
    and :func:`loads_json`."""
    return loads_json(read_bytes(path, JSON_LIMIT if limit is None else limit), path)


def _yaml_too_deep(data: bytes) -> bool:
    """A bound on YAML nesting read from the text, without parsing: flow nesting (``[``/``{``
    opened and not yet closed, counted as bytes: brackets inside quoted strings count too, which
    can only overstate it) over :data:`MAX_DEPTH`, or a line whose content starts after more than
    ``2 * MAX_DEPTH`` columns of indentation and ``- `` markers (a block collection nested in
    another starts at least one column further right). libyaml's C composer recurses once per
    level: 100,000 levels overflow the C stack (a segfault, on some builds) before any Python
    check runs."""
    import re

    import numpy as np

    if data.count(b"[") + data.count(b"{") > MAX_DEPTH:
        b = np.frombuffer(data, dtype=np.uint8)
        step = (np.isin(b, (ord("["), ord("{"))).astype(np.int32) - np.isin(b, (ord("]"), ord("}"))))
        if np.cumsum(step).max(initial=0) > MAX_DEPTH:
            return True
    prefixes = re.findall(rb"^[ \t-]*", data, re.M)
    return max(map(len, prefixes), default=0) > 2 * MAX_DEPTH


def read_yaml(path: str | os.PathLike, limit: int | None = None) -> Any:
    """A YAML file through :func:`read_bytes` and the safe loader (plain values only, nothing
    constructed), with the same depth bound as JSON."""
    import yaml  # PyYAML, shipped with omegaconf

    data = read_bytes(path, YAML_LIMIT if limit is None else limit)
    if _yaml_too_deep(data):  # before parsing: libyaml's composer recurses in C and can overflow the stack
        raise RunFileError(path, f"YAML nested deeper than {MAX_DEPTH} levels")
    try:
        obj = yaml.load(data.decode("utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except RecursionError:
        raise RunFileError(path, f"YAML nested deeper than {MAX_DEPTH} levels") from None
    except (yaml.YAMLError, ValueError) as exc:
        raise RunFileError(path, f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    if _depth(obj) > MAX_DEPTH:
        raise RunFileError(path, f"YAML nested deeper than {MAX_DEPTH} levels")
    return obj


def check_schema(schema: pa.Schema, where: str | os.PathLike) -> None:
    """The schema checks of a metric file: no column name twice, and every registered column
    (:data:`harness.io.schema.METRIC_COLUMNS` and the per-prompt ones) of a type that holds its
    values: a string column holds strings, a numeric column ints or floats (either: files of
    older versions wrote some as floats), or nulls only. Run on the file's whole schema even when
    only some columns are read, so the harness and the analysis judge a file alike."""
    from .schema import column_type

    names = schema.names
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise RunFileError(where, f"has the column {twice[0]!r} more than once")
    for field in schema:
        want, typ = column_type(field.name), field.type
        if want is None or pa.types.is_null(typ):
            continue
        if pa.types.is_dictionary(typ):  # pandas categoricals
            typ = typ.value_type
        if pa.types.is_string(want):
            ok = pa.types.is_string(typ) or pa.types.is_large_string(typ)
        else:  # numbers: ints and floats stack (Arrow promotes int -> float), as older files wrote them
            ok = pa.types.is_integer(typ) or pa.types.is_floating(typ)
        if not ok:
            raise RunFileError(where, f"column {field.name!r} is {field.type}, expected {want}")


def read_table(path: str | os.PathLike, columns: list[str] | None = None, limit: int | None = None) -> pa.Table:
    """A Parquet file as an Arrow table, through :func:`read_bytes` and :func:`check_schema`
    (``columns``: only those, each of which must exist). Read on one thread from memory
    (``ParquetFile.read``: about 5x less overhead per file than ``pq.read_table``'s dataset scan;
    the analysis reads thousands of small files)."""
    import pyarrow.parquet as pq

    data = read_bytes(path, TABLE_LIMIT if limit is None else limit)
    try:
        with pq.ParquetFile(pa.BufferReader(data), pre_buffer=False) as f:
            check_schema(f.schema_arrow, path)
            if columns is not None:
                absent = [c for c in columns if c not in f.schema_arrow.names]
                if absent:
                    raise RunFileError(path, f"has no column {absent[0]!r}")
            return f.read(columns=columns, use_threads=False)
    except RunFileError:
        raise
    except Exception as exc:  # noqa: BLE001 - ArrowInvalid, OSError...: any means unreadable
        raise RunFileError(path, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
