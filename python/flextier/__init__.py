"""FlexTier: compressed tensor frames for NumPy and PyTorch.

A thin binding of the FlexTier C library. The main calls:

    frame = flextier.encode(array, codec="zstd")      # -> bytes
    array = flextier.decode(frame)                     # -> numpy.ndarray
    flextier.decode(frame, out=existing)               # zero copy, returns out
    info  = flextier.frame_info(frame)                 # -> dict

Inputs are read in place through the buffer protocol (NumPy arrays,
``bytes``, ``memoryview``, PyTorch CPU tensors through ``Tensor.numpy()``,
other DLPack producers through ``numpy.from_dlpack``); the GIL is released
while the C library works, so several Python threads encode and decode in
parallel. Errors raise :class:`Error` subclasses that carry the C status.

Tensor store (write_tensor/read_tensor over ``mem:``, ``file:DIR`` and
``ucx://HOST:PORT`` memory nodes)::

    with flextier.Store("ucx://10.0.0.1:13337") as st:
        st.write_tensor("layer0/wq", w, codec="zstd")
        w2 = st.read_tensor("layer0/wq")               # or out=buffer
        req = st.read_tensor_async("layer1/wq", out=buf); req.wait()

Element types: float32, float16, bfloat16 (``ml_dtypes.bfloat16`` or
``torch.bfloat16``), int8, uint8, int32. See docs/python.md.
"""
from __future__ import annotations

import enum
import os
import signal
import tempfile
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from . import _flextier as _C

__version__ = "0.1.0"
LIB_VERSION: str = _C.LIB_VERSION

__all__ = [
    "encode", "decode", "frame_info", "codecs", "dtypes", "Status",
    "Store", "Request", "Session", "serve", "parse_size", "finetune",
    "Error", "InvalidArgumentError", "OutOfMemoryError", "CorruptError",
    "UnsupportedError", "StorageIOError", "NotFoundError", "NoSpaceError",
    "BufferTooSmallError", "AuthError", "NetworkError", "RequestTimeoutError",
    "ProtocolError", "BusyError", "ExistsError", "CanceledError", "InternalError",
]

# ------------------------------------------------------------------ status


class Status(enum.IntEnum):
    """The C library's ``ft_status`` codes (include/flextier/core.h)."""

    OK = 0
    INVALID_ARG = -1
    NOMEM = -2
    CORRUPT = -3
    UNSUPPORTED = -4
    IO = -5
    NOT_FOUND = -6
    NO_SPACE = -7
    BUFFER_SMALL = -8
    AUTH = -9
    NET = -10
    TIMEOUT = -11
    PROTOCOL = -12
    BUSY = -13
    EXISTS = -14
    CANCELED = -15
    INTERNAL = -16


class Error(Exception):
    """Base of every error the FlexTier library reports.

    Attributes:
        status: the C status code (an ``int``, negative; see :class:`Status`).
        status_name: ``"FT_ERR_CORRUPT"`` etc.
        detail: the library's detail message (``ft_last_error()``), which
            says which field, chunk or argument was wrong; may be empty.
    """

    status: int
    detail: str

    def __init__(self, status: int = Status.INTERNAL, detail: str = "") -> None:
        self.status = int(status)
        self.detail = detail
        text = _C.status_str(self.status)
        msg = f"{detail} ({self.status_name}: {text})" if detail else \
            f"{text} ({self.status_name})"
        super().__init__(msg)

    @property
    def status_name(self) -> str:
        try:
            return "FT_" + ("" if self.status == 0 else "ERR_") + Status(self.status).name
        except ValueError:
            return f"FT_STATUS_{self.status}"

    def __str__(self) -> str:  # KeyError would otherwise repr() its argument
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):  # pickle with status and detail, not the message
        return (self.__class__, (self.status, self.detail))


class InvalidArgumentError(Error, ValueError):
    """FT_ERR_INVALID_ARG: a bad argument (codec name, out= size, layout)."""


class OutOfMemoryError(Error, MemoryError):
    """FT_ERR_NOMEM: an allocation failed or a size limit was hit."""


class CorruptError(Error, ValueError):
    """FT_ERR_CORRUPT: a frame or stored object failed validation."""


class UnsupportedError(Error, ValueError):
    """FT_ERR_UNSUPPORTED: valid but not supported (dtype, codec, version)."""


class StorageIOError(Error, OSError):
    """FT_ERR_IO: a file system error (errno text in the detail)."""


class NotFoundError(Error, KeyError):
    """FT_ERR_NOT_FOUND: the key, file or tensor does not exist."""


class NoSpaceError(Error):
    """FT_ERR_NO_SPACE: the store's capacity is exhausted."""


class BufferTooSmallError(Error, ValueError):
    """FT_ERR_BUFFER_SMALL: an output buffer is too small."""


class AuthError(Error, PermissionError):
    """FT_ERR_AUTH: authentication with the memory node failed."""


class NetworkError(Error, ConnectionError):
    """FT_ERR_NET: transport error, peer unreachable or gone."""


class RequestTimeoutError(Error, TimeoutError):
    """FT_ERR_TIMEOUT: the operation timed out."""


class ProtocolError(Error):
    """FT_ERR_PROTOCOL: the peer violated the wire protocol."""


class BusyError(Error):
    """FT_ERR_BUSY: the resource is in use (e.g. leased)."""


class ExistsError(Error):
    """FT_ERR_EXISTS: the object already exists."""


class CanceledError(Error):
    """FT_ERR_CANCELED: the operation was canceled."""


class InternalError(Error):
    """FT_ERR_INTERNAL: a bug in FlexTier; please report it."""


_ERROR_CLASSES: Dict[int, type] = {
    Status.INVALID_ARG: InvalidArgumentError,
    Status.NOMEM: OutOfMemoryError,
    Status.CORRUPT: CorruptError,
    Status.UNSUPPORTED: UnsupportedError,
    Status.IO: StorageIOError,
    Status.NOT_FOUND: NotFoundError,
    Status.NO_SPACE: NoSpaceError,
    Status.BUFFER_SMALL: BufferTooSmallError,
    Status.AUTH: AuthError,
    Status.NET: NetworkError,
    Status.TIMEOUT: RequestTimeoutError,
    Status.PROTOCOL: ProtocolError,
    Status.BUSY: BusyError,
    Status.EXISTS: ExistsError,
    Status.CANCELED: CanceledError,
    Status.INTERNAL: InternalError,
}


def _make_error(status: int, detail: str = "") -> Error:
    return _ERROR_CLASSES.get(status, Error)(status, detail)


_C._set_error_factory(_make_error)

# ------------------------------------------------------------------ dtypes

_DT_F32, _DT_F16, _DT_BF16 = _C.DT_F32, _C.DT_F16, _C.DT_BF16
_DT_I8, _DT_U8, _DT_I32 = _C.DT_I8, _C.DT_U8, _C.DT_I32

_DT_NAMES = {_DT_F32: "float32", _DT_F16: "float16", _DT_BF16: "bfloat16",
             _DT_I8: "int8", _DT_U8: "uint8", _DT_I32: "int32"}
_DT_ALIASES = {
    "float32": _DT_F32, "f32": _DT_F32, "float": _DT_F32, "f4": _DT_F32,
    "float16": _DT_F16, "f16": _DT_F16, "half": _DT_F16, "f2": _DT_F16,
    "bfloat16": _DT_BF16, "bf16": _DT_BF16,
    "int8": _DT_I8, "i8": _DT_I8, "i1": _DT_I8,
    "uint8": _DT_U8, "u8": _DT_U8, "u1": _DT_U8,
    "int32": _DT_I32, "i32": _DT_I32, "i4": _DT_I32, "int": _DT_I32,
}
_NP_KIND = {("f", 4): _DT_F32, ("f", 2): _DT_F16, ("i", 1): _DT_I8,
            ("u", 1): _DT_U8, ("i", 4): _DT_I32}


def dtypes() -> Tuple[str, ...]:
    """Names of the element types FlexTier encodes."""
    return tuple(_DT_NAMES[c] for c in sorted(_DT_NAMES))


def codecs() -> Tuple[str, ...]:
    """Codec names accepted by :func:`encode` (``byteplane`` also as
    ``byteplane-lz4`` / ``bp-deflate`` etc. to pick its entropy stage).
    A codec not built into the C library raises UnsupportedError."""
    return ("raw", "lz4", "zstd", "deflate", "byteplane", "q8", "q4")


def _bfloat16_type():
    try:
        import ml_dtypes  # noqa: PLC0415 (optional until a bf16 tensor shows up)
    except ImportError as e:  # pragma: no cover - ml_dtypes is a dependency
        raise UnsupportedError(Status.UNSUPPORTED,
                               "bfloat16 arrays need the ml_dtypes package") from e
    return ml_dtypes.bfloat16


def _np_dtype(code: int) -> np.dtype:
    if code == _DT_BF16:
        return np.dtype(_bfloat16_type())
    return np.dtype(_DT_NAMES[code])


def _is_torch_tensor(obj: Any) -> bool:
    mod = type(obj).__module__
    return (mod == "torch" or mod.startswith("torch.")) and hasattr(obj, "is_contiguous")


def _dtype_code(dtype: Any) -> int:
    """FlexTier dtype code of a NumPy/ml_dtypes/torch dtype or a name."""
    if isinstance(dtype, str):
        code = _DT_ALIASES.get(dtype.lower().replace("torch.", ""))
        if code is None:
            raise UnsupportedError(Status.UNSUPPORTED, f"unsupported dtype {dtype!r}; "
                                   f"FlexTier handles {', '.join(dtypes())}")
        return code
    if type(dtype).__module__ == "torch":               # torch.dtype
        return _dtype_code(str(dtype))
    try:
        d = np.dtype(dtype)
    except TypeError as e:
        raise InvalidArgumentError(Status.INVALID_ARG, f"not a dtype: {dtype!r}") from e
    if d.name == "bfloat16" and d.itemsize == 2:        # ml_dtypes ('V' kind)
        return _DT_BF16
    code = _NP_KIND.get((d.kind, d.itemsize))
    if code is None or d.byteorder == ">":
        raise UnsupportedError(Status.UNSUPPORTED, f"unsupported dtype {d.name} ({d.str}); "
                               f"FlexTier handles {', '.join(dtypes())}")
    return code


def _export(obj: Any, writable: bool, what: str) -> Tuple[Any, int]:
    """(object exporting a plain C-contiguous buffer, dtype code or -1 to
    take it from the buffer's format). Never copies."""
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise InvalidArgumentError(
                Status.INVALID_ARG, f"{what} is not C-contiguous (strides {obj.strides}); "
                "pass numpy.ascontiguousarray(...) to copy it explicitly")
        if writable and not obj.flags.writeable:
            raise InvalidArgumentError(Status.INVALID_ARG, f"{what} is read-only")
        d = obj.dtype
        if d.kind == "V":      # ml_dtypes types do not export a buffer format
            if d.name == "bfloat16" and d.itemsize == 2:
                return obj.view(np.uint16), _DT_BF16
            raise UnsupportedError(Status.UNSUPPORTED, f"unsupported dtype {d.name}; "
                                   f"FlexTier handles {', '.join(dtypes())}")
        return obj, -1
    if _is_torch_tensor(obj):
        if obj.device.type != "cpu":
            raise InvalidArgumentError(Status.INVALID_ARG,
                                       f"{what} is on {obj.device}; FlexTier reads CPU "
                                       "tensors (use .cpu(), or pinned memory)")
        if not obj.is_contiguous():
            raise InvalidArgumentError(Status.INVALID_ARG, f"{what} is not contiguous; "
                                       "pass tensor.contiguous() to copy it explicitly")
        t = obj.detach()
        if str(t.dtype) == "torch.bfloat16":
            import torch  # noqa: PLC0415 (already imported: obj is a tensor)
            return t.view(torch.int16).numpy(), _DT_BF16
        return t.numpy(), -1
    if hasattr(type(obj), "__dlpack__") and not isinstance(obj, (bytes, bytearray, memoryview)):
        try:
            arr = np.from_dlpack(obj)
        except (BufferError, TypeError, RuntimeError) as e:
            raise InvalidArgumentError(Status.INVALID_ARG,
                                       f"{what}: DLPack export failed: {e}") from e
        return _export(arr, writable, what)
    return obj, -1       # bytes, bytearray, memoryview, array.array, mmap, ...


# ------------------------------------------------------------------ codec


def encode(array: Any, codec: str = "zstd", level: int = 0, group_size: int = 64,
           group_dim: int = -1, chunk_size: Optional[int] = None,
           threads: int = 0) -> bytes:
    """Encode a tensor into a self-describing FlexTier frame.

    Args:
        array: a C-contiguous NumPy array, PyTorch CPU tensor, DLPack
            producer or any buffer-protocol object with a shape (its format
            gives the dtype: float32, float16, bfloat16, int8, uint8,
            int32). Read in place, never copied.
        codec: ``raw``, ``lz4``, ``zstd``, ``deflate``, ``byteplane``
            (``byteplane-lz4``, ``bp-deflate``: entropy stage), ``q8``,
            ``q4`` (lossy, float dtypes only).
        level: zstd (-100..22) or deflate (0..12) level; 0 = default.
        group_size, group_dim: q8/q4 quantization groups (FlexGen layout:
            ``group_size`` elements along ``group_dim`` share a min/scale).
        chunk_size: raw bytes per independently coded chunk (4 KiB to
            64 MiB; default 256 KiB).
        threads: worker threads for this call's chunks; 0 = default
            (``FLEXTIER_THREADS`` or the number of CPUs).

    Returns:
        ``bytes`` holding the frame (encoded straight into it, no second
        copy). The GIL is released while encoding.

    Raises:
        InvalidArgumentError, UnsupportedError, OutOfMemoryError.
    """
    buf, code = _export(array, False, "array")
    return _C.encode(buf, code, codec, level, group_size, group_dim,
                     0 if chunk_size is None else chunk_size, threads)


def decode(buf: Any, out: Any = None, dtype: Any = None, threads: int = 0) -> Any:
    """Decode a frame into a new NumPy array or, zero-copy, into ``out``.

    Args:
        buf: the frame: ``bytes``, ``bytearray``, ``memoryview``, a uint8
            array, an ``mmap``... (any C-contiguous buffer), read in place.
        out: optional destination: a writable C-contiguous NumPy array,
            PyTorch CPU tensor or buffer whose size is exactly the decoded
            tensor's (any shape). Decoded directly into, then returned. A
            plain byte buffer (``bytearray``, uint8 array) takes any dtype
            given with ``dtype=``.
        dtype: output element type; default the frame's. A float frame
            (float32/float16/bfloat16, also q8/q4) decodes to any float
            type, converted on the fly; others only to their own type.
            With a typed ``out`` it must match ``out``'s dtype.
        threads: worker threads; 0 = default.

    Returns:
        ``out`` if given, else a new ``numpy.ndarray`` of the frame's shape
        (bfloat16 as ``ml_dtypes.bfloat16``). The GIL is released while
        decoding.

    Raises:
        CorruptError (bad or truncated frame, checksum mismatch),
        InvalidArgumentError (wrong ``out`` size/dtype), UnsupportedError.
    """
    if out is None:
        info = _C.frame_info(buf)
        code = info["dtype_code"] if dtype is None else _dtype_code(dtype)
        arr = np.empty(info["shape"], dtype=_np_dtype(code))
        target, _ = _export(arr, True, "out")
        _C.decode_into(buf, target, code, threads)
        return arr
    target, code = _export(out, True, "out")
    if dtype is not None:
        want = _dtype_code(dtype)
        if code < 0:
            have = _buffer_dtype_code(target)
            if have is not None and have != want and have != _DT_U8:
                raise InvalidArgumentError(
                    Status.INVALID_ARG, f"dtype={_DT_NAMES[want]} does not match out's "
                    f"element type {_DT_NAMES[have]}")
        elif code != want:
            raise InvalidArgumentError(
                Status.INVALID_ARG, f"dtype={_DT_NAMES[want]} does not match out's element "
                f"type {_DT_NAMES[code]}")
        code = want
    _C.decode_into(buf, target, code, threads)
    return out


def _buffer_dtype_code(obj: Any) -> Optional[int]:
    """dtype code of a typed buffer (None when untyped/unknown)."""
    if isinstance(obj, np.ndarray):
        try:
            return _dtype_code(obj.dtype)
        except Error:
            return None
    try:
        with memoryview(obj) as m:
            fmt = m.format.lstrip("@=<")
    except TypeError:
        return None
    return {"f": _DT_F32, "e": _DT_F16, "b": _DT_I8, "B": _DT_U8, "c": _DT_U8,
            "i": _DT_I32}.get(fmt)


def frame_info(buf: Any, partial: bool = False) -> Dict[str, Any]:
    """Parse and validate a frame's header and chunk table.

    Args:
        buf: the frame (any C-contiguous buffer).
        partial: accept a prefix holding at least the header (streaming);
            otherwise the whole frame must be present.

    Returns:
        dict with ``version``, ``codec``, ``entropy`` (byteplane only),
        ``level``, ``dtype`` (``"float32"``, ``"bfloat16"``...),
        ``dtype_code``, ``shape`` (tuple), ``chunk_size``, ``group_size``
        and ``group_dim`` (q8/q4, else None), ``n_chunks``, ``numel``,
        ``raw_size``, ``frame_size``, ``header_size``, ``checksum``,
        ``lossy``.

    Raises:
        CorruptError if it is not a valid frame (or is truncated).
    """
    info = _C.frame_info(buf, partial)
    info["dtype"] = _DT_NAMES[info["dtype_code"]]
    return info


def default_threads() -> int:
    """Worker threads a call with ``threads=0`` uses."""
    return _C.default_threads()


# ------------------------------------------------------------------ store


def _wrap_owned(raw: Tuple[Any, int, Tuple[int, ...]]) -> np.ndarray:
    """numpy array over a buffer the C library allocated (zero copy: the
    array's .base owns the memory)."""
    owner, code, shape = raw
    dt = _np_dtype(code)
    arr = np.frombuffer(owner, dtype=dt) if memoryview(owner).nbytes else np.empty(0, dt)
    return arr.reshape(shape)


def _nbytes(obj: Any) -> int:
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    with memoryview(obj) as m:
        return m.nbytes


def _out_code(target: Any, code: int, dtype: Any) -> int:
    """dtype code to decode into `target` (as in decode())."""
    if dtype is None:
        return code
    want = _dtype_code(dtype)
    have = code if code >= 0 else _buffer_dtype_code(target)
    if have is not None and have != want and have != _DT_U8:
        raise InvalidArgumentError(Status.INVALID_ARG, f"dtype={_DT_NAMES[want]} does not "
                                   f"match out's element type {_DT_NAMES[have]}")
    return want


def _check_filled(out: Any, target: Any, code: int, shape: Tuple[int, ...]) -> None:
    n = 1
    for d in shape:
        n *= d
    need = n * _np_dtype(code).itemsize
    have = _nbytes(target)
    if need != have:
        raise InvalidArgumentError(
            Status.INVALID_ARG, f"out has {have} bytes but the stored tensor "
            f"({_DT_NAMES[code]}, shape {shape}) has {need}; its first {need} bytes were written")


class Request:
    """Handle of an asynchronous store operation, like a
    ``concurrent.futures.Future``: :meth:`wait` / :meth:`result` block
    (GIL released, interruptible) and return the value (``None`` for a
    write, the array for a read) or raise the operation's :class:`Error`.
    Buffers passed in stay referenced until the request finishes; do not
    modify them meanwhile. Dropping an unfinished request waits for it."""

    def __init__(self, creq: Any, finish: Callable[[Any], Any]) -> None:
        self._req = creq
        self._finish = finish
        self._lock = threading.Lock()
        self._have = False
        self._value: Any = None

    def done(self) -> bool:
        """True once the operation finished (successfully or not)."""
        return self._have or self._req.done()

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Wait up to ``timeout`` seconds (None: forever); return the
        result or raise the operation's error; RequestTimeoutError if it
        is still running."""
        if not self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            raise RequestTimeoutError(Status.TIMEOUT, "request still running")
        try:
            if not self._have:
                raw = self._req.wait(timeout)
                self._value = self._finish(raw)
                self._have = True
                self._finish = None
            return self._value
        finally:
            self._lock.release()

    result = wait

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """The operation's error (None on success), waiting like wait();
        raises RequestTimeoutError if it is still running."""
        try:
            self.wait(timeout)
        except RequestTimeoutError as e:
            if self.done():          # the operation itself timed out
                return e
            raise
        except Error as e:
            return e
        return None


class Store:
    """A tensor store: ``mem:`` (this process), ``file:DIR`` (one file per
    tensor) or ``ucx://HOST:PORT`` (a memory node, ``flextier serve`` or
    :func:`serve`).

    Tensors are stored as FlexTier frames: :meth:`write_tensor` encodes
    with the given codec (None = raw), :meth:`read_tensor` decodes; dtype
    and shape travel with the data. All methods are thread-safe and release
    the GIL; synchronous calls from several threads are serialized on the
    store's codec context, so use the ``*_async`` calls (``queue_depth``
    requests execute at once) for parallel transfers.

    Args:
        uri: ``mem:``, ``file:DIR`` or ``ucx://HOST:PORT``.
        token: the memory node's shared secret (or ``token_file``, or the
            ``FLEXTIER_TOKEN_FILE`` environment variable).
        queue_depth: async requests executing concurrently (1..64).
        codec_threads: threads of the synchronous calls' codec (0 = CPUs).
        timeout_ms: per-operation timeout (0 = library default, 30 s).

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, uri: str, token: Optional[str] = None, *,
                 token_file: Optional[str] = None, queue_depth: int = 4,
                 codec_threads: int = 0, timeout_ms: int = 0) -> None:
        self.uri = uri
        if token is not None and token_file is not None:
            raise InvalidArgumentError(Status.INVALID_ARG, "pass token or token_file, not both")
        if token is None:
            self._s = _C.Store(uri, token_file, queue_depth, codec_threads, timeout_ms)
            return
        # The C API reads the secret from a file once, at open: hand it a
        # private temporary file (mode 0600) and remove it right after.
        fd, path = tempfile.mkstemp(prefix="flextier-token-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(token.encode() if isinstance(token, str) else bytes(token))
            self._s = _C.Store(uri, path, queue_depth, codec_threads, timeout_ms)
        finally:
            os.unlink(path)

    # -- context manager

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Wait for outstanding async requests, then close (idempotent).
        Raises BusyError if another thread is inside a call on this store."""
        self._s.close()

    @property
    def closed(self) -> bool:
        return self._s.closed

    def __repr__(self) -> str:
        return f"<flextier.Store {self.uri!r}{' closed' if self.closed else ''}>"

    # -- tensors

    def write_tensor(self, key: str, array: Any, codec: Optional[str] = None, level: int = 0,
                     group_size: int = 64, group_dim: int = -1,
                     chunk_size: Optional[int] = None) -> None:
        """Encode ``array`` (as :func:`encode`; codec None = raw) and store
        it under ``key``, replacing any previous tensor atomically. Keys:
        1..255 printable ASCII characters without space, ``/`` allowed."""
        buf, code = _export(array, False, "array")
        self._s.write(key, buf, code, codec, level, group_size, group_dim,
                      0 if chunk_size is None else chunk_size)

    def read_tensor(self, key: str, out: Any = None, dtype: Any = None) -> Any:
        """Read ``key``: into a new NumPy array (over the library's buffer,
        no copy), or decoded straight into ``out`` (a writable C-contiguous
        array/tensor/buffer of exactly the tensor's size), which is
        returned. ``dtype`` converts float tensors (float32/float16/
        bfloat16). Raises NotFoundError (a KeyError) for a missing key."""
        if out is None:
            code = -1 if dtype is None else _dtype_code(dtype)
            return _wrap_owned(self._s.read(key, code))
        target, code = _export(out, True, "out")
        code = _out_code(target, code, dtype)
        got, shape = self._s.read_into(key, target, code)
        _check_filled(out, target, got, shape)
        return out

    def write_tensor_async(self, key: str, array: Any, codec: Optional[str] = None,
                           level: int = 0, group_size: int = 64, group_dim: int = -1,
                           chunk_size: Optional[int] = None) -> Request:
        """Start :meth:`write_tensor`; returns a :class:`Request` whose
        result is None. ``array`` must not change until it completes."""
        buf, code = _export(array, False, "array")
        creq = self._s.write_async(key, buf, code, codec, level, group_size, group_dim,
                                   0 if chunk_size is None else chunk_size)
        return Request(creq, lambda raw: None)

    def read_tensor_async(self, key: str, out: Any = None, dtype: Any = None) -> Request:
        """Start :meth:`read_tensor`; returns a :class:`Request` whose result
        is the array (``out`` if given). Without ``out`` the tensor comes
        back in its stored dtype (``dtype=`` needs ``out=``)."""
        if out is None:
            if dtype is not None:
                raise InvalidArgumentError(Status.INVALID_ARG,
                                           "read_tensor_async: dtype= needs out=")
            return Request(self._s.read_async(key), _wrap_owned)
        target, code = _export(out, True, "out")
        code = _out_code(target, code, dtype)
        creq = self._s.read_async(key, target, code)

        def finish(_raw: Any) -> Any:
            got, shape = creq.out_info()
            _check_filled(out, target, got, shape)
            return out
        return Request(creq, finish)

    def delete(self, key: str) -> None:
        """Delete ``key`` (NotFoundError if absent)."""
        self._s.delete(key)

    def list(self) -> List[str]:
        """All keys, sorted."""
        return sorted(self._s.list())

    def stat(self, key: str) -> Dict[str, Any]:
        """dtype, shape, codec, entropy, level, raw_bytes, stored_bytes."""
        d = self._s.stat(key)
        d["dtype"] = _DT_NAMES.get(d["dtype_code"], str(d["dtype_code"]))
        return d

    def stats(self) -> Dict[str, int]:
        """Store counters (memory node: capacity, used, tensors,
        connections, bytes_in/out, spill usage, puts, gets)."""
        return self._s.stats()

    def __contains__(self, key: str) -> bool:
        try:
            self._s.stat(key)
        except NotFoundError:
            return False
        return True

    def put_frame(self, key: str, frame: Any) -> None:
        """Store an already encoded frame (validated first)."""
        self._s.put_frame(key, frame)

    def get_frame(self, key: str) -> memoryview:
        """The stored frame, as a memoryview over a buffer the library
        allocated (decode it with :func:`decode`)."""
        return self._s.get_frame(key)


# ------------------------------------------------------------ memory node

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _lora_list(lora: Any) -> Optional[List[Tuple[str, float]]]:
    """None, a directory, a (directory, scale) pair or a list of them ->
    [(directory, scale), ...]."""
    if lora is None:
        return None
    if isinstance(lora, (str, os.PathLike)) or (isinstance(lora, tuple) and len(lora) == 2
                                                 and isinstance(lora[1], (int, float))):
        lora = [lora]
    out = []
    for item in lora:
        if isinstance(item, (str, os.PathLike)):
            out.append((os.fspath(item), 1.0))
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            out.append((os.fspath(item[0]), float(item[1])))
        else:
            raise InvalidArgumentError(Status.INVALID_ARG,
                                       f"lora: expected a directory or a (directory, scale) pair, not {item!r}")
    return out


class Session:
    """A model opened for generation (the C library's session API,
    include/flextier/session.h): the model directory's weights in their
    compute format, placed on the tiers of an offloading policy (given, or
    planned for this machine with ``policy="auto"``), its tokenizer, and a
    compute context on the CPU or a CUDA GPU.

    Args:
        model_dir: a Hugging Face model directory (config.json,
            *.safetensors, tokenizer.json or vocab.json + merges.txt).
        device: ``"cpu"`` or ``"cuda"``.
        weights: ``"auto"`` (the checkpoint's dtype), ``"f32"``, ``"bf16"``,
            ``"f16"``, ``"q8"``, ``"q4"``.
        kv_dtype: the in-memory KV cache, ``"bf16"`` (default), ``"f16"``,
            ``"f32"``.
        policy: None (everything in memory), ``"auto"``, or a policy spec
            such as ``"w=0,0,100 c=100"`` (docs/offload.md).
        remotes, disk_dir, compress_weights, compress_cache: added to the
            policy (``["ucx://host:7000"]``, ``"/nvme/ft"``, ``"q4"``, ...).
        device_mem: the device budget (bytes or ``"2G"``).
        memory: the whole process's memory budget (bytes or ``"1.5G"``;
            ``"unlimited"``; default: ``FLEXTIER_MEMORY``, else the cgroup's
            limit or the available memory minus a headroom); ``"auto"``
            plans within it, and what cannot fit is refused before loading.
        allow_lossy: ``policy="auto"`` may choose q8/q4 weights or cache
            (default: lossless formats only).
        recalibrate: ``policy="auto"``: measure the machine again.
        lora: PEFT LoRA adapters applied in every forward, unmerged, in
            order: a directory, a ``(directory, scale)`` pair, or a list of
            them (scale multiplies the adapter's alpha / r; default 1), as
            ``flextier run --lora DIR[:SCALE]``. CPU only.
        token / token_file: the memory nodes' shared secret.
        threads, decode_threads, max_batch, max_seq, strict: as the CLI's.

    One thread at a time may use a session (another call raises
    :class:`BusyError`); the GIL is released while generating.
    """

    def __init__(self, model_dir: str, *, device: str = "cpu", weights: str = "auto",
                 kv_dtype: Optional[str] = None, policy: Optional[str] = None,
                 remotes: Optional[List[str]] = None, disk_dir: Optional[str] = None,
                 compress_weights: Optional[str] = None, compress_cache: Optional[str] = None,
                 device_mem: Any = 0, token: Optional[str] = None, token_file: Optional[str] = None,
                 threads: int = 0, decode_threads: int = 0, max_batch: int = 0, max_seq: int = 0,
                 strict: bool = False, memory: Any = 0, allow_lossy: bool = False,
                 recalibrate: bool = False, lora: Any = None) -> None:
        items = []
        if remotes:
            items.append("remote=" + ",".join(remotes))
        if disk_dir:
            items.append("disk=file:" + disk_dir)
        if compress_weights:
            items.append("cw=" + compress_weights)
        if compress_cache:
            items.append("cc=" + compress_cache)
        if items and policy is None:
            raise InvalidArgumentError(Status.INVALID_ARG,
                                       "remotes/disk_dir/compress_weights/compress_cache need a policy")
        spec = None if policy is None else " ".join([policy] + items)
        if token is not None and token_file is not None:
            raise InvalidArgumentError(Status.INVALID_ARG, "pass token or token_file, not both")
        self.stats: Dict[str, Any] = {}
        args = dict(device=device, weights=weights, kv_dtype=kv_dtype, threads=threads, policy=spec,
                    device_mem=parse_size(device_mem) if device_mem else 0, max_batch=max_batch,
                    max_seq=max_seq, strict=strict, decode_threads=decode_threads,
                    memory=(2**64 - 1 if memory == "unlimited" else parse_size(memory) if memory else 0),
                    allow_lossy=allow_lossy, recalibrate=recalibrate, lora=_lora_list(lora))
        if token is None:
            self._s = _C.Session(model_dir, token_file=token_file, **args)
            return
        fd, path = tempfile.mkstemp(prefix="flextier-token-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(token.encode() if isinstance(token, str) else bytes(token))
            self._s = _C.Session(model_dir, token_file=path, **args)
        finally:
            os.unlink(path)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Free the model and everything it holds (idempotent)."""
        self._s.close()

    def info(self) -> Dict[str, Any]:
        """The model, its weight format and bytes, the policy in force, and
        the memory budget (``memory_budget``, ``memory_estimate`` in bytes,
        ``memory_source``)."""
        return self._s.info()

    def generate(self, prompts: Any, max_new_tokens: int = 64, *, temperature: float = -1.0,
                 top_k: int = -1, top_p: float = -1.0, repetition_penalty: float = -1.0,
                 seed: Optional[int] = None, stop: Union[None, str, List[str]] = None,
                 ignore_eos: bool = False, on_text: Optional[Callable[[int, str], Any]] = None,
                 cancel: Any = None, add_special: bool = True) -> Any:
        """Generate from one prompt (returns its text) or a list of prompts
        (one batch; returns a list of texts). Sampling values left negative
        come from the model's generation_config.json (greedy when it does
        not sample); ``temperature=0`` is greedy. ``stop``: a string or a
        list of strings; the text ends before the first one that appears.
        ``on_text(seq, text)`` is called with each piece of new text as it
        is decoded; returning a true value stops that sequence. ``cancel``:
        an object with ``is_set()`` (a :class:`threading.Event`), checked
        at every token; once set, every sequence stops. Ctrl-C stops the
        generation at the next token (KeyboardInterrupt) and leaves the
        session usable. ``add_special=False`` encodes the prompts without
        the tokenizer's special tokens (a rendered chat template holds
        them). ``self.stats`` holds the prefill and decode token counts and
        times of the call."""
        single = isinstance(prompts, str)
        texts, self.stats = self._s.generate([prompts] if single else list(prompts), max_new_tokens,
                                             temperature, top_k, top_p, repetition_penalty, seed, stop,
                                             ignore_eos, on_text, cancel, not add_special)
        return texts[0] if single else texts

    def stream(self, prompt: str, max_new_tokens: int = 64, **kw: Any) -> Iterator[str]:
        """Iterate over the text of one prompt's generation as it is
        produced (the same keywords as :meth:`generate`). Generation stops
        at the next token when the caller stops iterating (``break``, the
        iterator closed or collected) or presses Ctrl-C; the session is
        free again when that returns."""
        import queue
        q: "queue.Queue[Any]" = queue.Queue()
        done = object()
        box: Dict[str, Any] = {}
        stop = threading.Event()

        def run() -> None:
            try:
                self.generate(prompt, max_new_tokens, on_text=lambda _s, t: q.put(t), cancel=stop, **kw)
            except BaseException as e:  # re-raised in the consumer
                box["error"] = e
            finally:
                q.put(done)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is done:
                    break
                yield item
        finally:
            # the consumer stopped early (break, close, Ctrl-C) or finished:
            # stop the generation and wait for it, so the session is free
            stop.set()
            t.join()
        if "error" in box:
            raise box["error"]

    def apply_chat_template(self, messages: List[Dict[str, Any]], add_generation_prompt: bool = True, *,
                            chat_template: Optional[str] = None, **variables: Any) -> str:
        """The conversation rendered with the model's chat template (as
        transformers' ``apply_chat_template(tokenize=False)``), or with
        ``chat_template`` (Jinja source). ``variables`` (``tools=...``,
        ``enable_thinking=...``) are passed to the template. Raises
        NotFoundError when the model has no template and none is given."""
        import json
        extra = json.dumps(variables) if variables else None
        return self._s.apply_chat_template(json.dumps(messages), add_generation_prompt, extra, chat_template)

    def chat(self, messages: List[Dict[str, Any]], max_new_tokens: int = 256, *, stream: bool = False,
             chat_template: Optional[str] = None, tools: Optional[List[Any]] = None, **kw: Any) -> Any:
        """The assistant's reply to ``messages`` (OpenAI-style dicts with
        ``role`` and ``content``), rendered with the model's chat template
        (or ``chat_template``) and generated with the keywords of
        :meth:`generate` (``stop`` may be a list). ``stream=True`` returns
        an iterator over the reply's text (see :meth:`stream`)."""
        variables = {"tools": tools} if tools is not None else {}
        prompt = self.apply_chat_template(messages, True, chat_template=chat_template, **variables)
        if stream:
            return self.stream(prompt, max_new_tokens, add_special=False, **kw)
        return self.generate(prompt, max_new_tokens, add_special=False, **kw)

    def tokenize(self, text: str, add_special: bool = True) -> List[int]:
        """The model tokenizer's ids for ``text`` (``add_special``: its
        special tokens, as Hugging Face's ``add_special_tokens``)."""
        return self._s.tokenize(text, add_special)

    def detokenize(self, ids: List[int], skip_special: bool = True) -> str:
        """Text of token ids (Hugging Face's ``decode``)."""
        return self._s.detokenize(list(ids), skip_special)

    def generate_ids(self, prompts: List[List[int]], max_new_tokens: int = 64, *,
                     temperature: float = -1.0, top_k: int = -1, top_p: float = -1.0,
                     repetition_penalty: float = -1.0, seed: Optional[int] = None,
                     ignore_eos: bool = False) -> List[List[int]]:
        """Token ids in, token ids out (one batch)."""
        ids, self.stats = self._s.generate_ids(prompts, max_new_tokens, temperature, top_k, top_p,
                                               repetition_penalty, seed, ignore_eos)
        return ids


def _mix(state: List[int]) -> int:
    """splitmix64, as `flextier finetune` draws its data order."""
    m = (1 << 64) - 1
    state[0] = (state[0] + 0x9E3779B97F4A7C15) & m
    z = state[0]
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def _shuffle(n: int, seed: int, epoch: int) -> List[int]:
    st = [(seed * 0x100000001B3 + epoch) & ((1 << 64) - 1)]
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = _mix(st) % (i + 1)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def finetune(model: str, data: str, out: str, *, steps: int = 100, lr: float = 1e-3, rank: int = 8,
             alpha: float = 16.0, targets: str = "all", seq_len: int = 128, batch: int = 4, grad_accum: int = 1,
             warmup: Optional[int] = None, schedule: str = "cosine", weight_decay: float = 0.01,
             clip: float = 1.0, seed: int = 0, eval_frac: float = 0.1, init: Optional[str] = None,
             weights: str = "auto", threads: int = 0, chat_template: Optional[str] = None,
             dropout: float = 0.0,
             on_progress: Optional[Callable[[Dict[str, Any]], Any]] = None) -> Dict[str, Any]:
    """LoRA fine-tuning, as ``flextier finetune`` (docs/training.md): the
    same library calls (the data reader, AdamW steps, the held-out split),
    the same data order for a seed, so equal arguments give the CLI's
    adapter byte for byte. Writes a PEFT adapter to ``out``.

    Args:
        model: a Hugging Face model directory (any architecture `flextier
            finetune` trains).
        data: plain text, or JSONL (``.jsonl``) with ``{"text": ...}`` or
            ``{"messages": [...]}`` lines (rendered with the model's chat
            template or ``chat_template``, a Jinja file; the loss on the
            assistant turns only).
        steps, lr, rank, alpha, targets, seq_len, batch, grad_accum, warmup
            (default steps // 10), schedule, weight_decay, clip, seed,
            eval_frac, init, weights, threads, dropout (lora_dropout in
            [0, 1)): as the CLI's options.
        on_progress: called after every step with a dict (``step``,
            ``steps``, ``loss``, ``lr``, ``grad_norm``, ``tok_s``,
            ``eta_s``); returning True stops the run there (the adapter of
            the steps taken is written).

    Returns a dict: ``losses`` (per step), ``eval_before`` / ``eval_after``
    (held-out ``(loss, perplexity)`` or None), ``steps`` taken,
    ``tokens``, ``train_sequences``, ``eval_sequences``, ``labels``.
    """
    import math
    import time
    if warmup is None:
        warmup = steps // 10
    if steps < 1 or seq_len < 2 or batch < 1 or grad_accum < 1 or not 0 <= eval_frac <= 0.9:
        raise InvalidArgumentError(Status.INVALID_ARG, "finetune: steps, seq_len, batch, grad_accum >= 1 "
                                   "(seq_len >= 2) and eval_frac in [0, 0.9]")
    if warmup > steps:
        raise InvalidArgumentError(Status.INVALID_ARG, f"finetune: warmup {warmup} is more than steps {steps}")
    t = _C.Trainer(model, weights=weights, rank=rank, alpha=alpha, targets=targets, lr=lr,
                   weight_decay=weight_decay, clip=clip, warmup=warmup, total_steps=steps, schedule=schedule,
                   grad_accum=grad_accum, seed=seed, threads=threads, dropout=dropout)
    if init is not None:
        t.load_adapter(init)
    info = t.info()
    seq = min(seq_len, info["max_pos"])
    raw, rawmask, labels = t.load_data(data, chat_template)
    ids = np.frombuffer(raw, dtype=np.int32)
    mask = None if rawmask is None else np.frombuffer(rawmask, dtype=np.uint8)
    nseq = len(ids) // seq
    neval = int(math.ceil(eval_frac * nseq)) if eval_frac > 0 and nseq >= 2 else 0
    ntrain = nseq - neval
    if ntrain < 1:
        raise InvalidArgumentError(Status.INVALID_ARG, f"finetune: {data} has {len(ids)} tokens: {nseq} "
                                   f"sequence(s) of {seq}, too few for training")
    seqs = ids[:nseq * seq].reshape(nseq, seq)
    smask = None if mask is None else mask[:nseq * seq].reshape(nseq, seq)

    def evaluate() -> Optional[Tuple[float, float]]:
        if not neval:
            return None
        tot, cnt = 0.0, 0
        for i in range(ntrain, nseq, batch):
            j = min(i + batch, nseq)
            s_, c_ = t.eval(np.ascontiguousarray(seqs[i:j]), j - i, seq,
                            None if smask is None else np.ascontiguousarray(smask[i:j]))
            tot += s_
            cnt += c_
        if not cnt:
            raise InvalidArgumentError(Status.INVALID_ARG, "eval: the held-out sequences have no labelled token")
        return tot / cnt, math.exp(tot / cnt)

    before = evaluate()
    per = grad_accum * batch
    perm, epoch, cursor = _shuffle(ntrain, seed, 0), 0, 0
    losses = []
    t0 = time.time()
    taken = 0
    for s in range(steps):
        rows = []
        for _ in range(per):
            if cursor == ntrain:
                cursor = 0
                epoch += 1
                perm = _shuffle(ntrain, seed, epoch)
            rows.append(perm[cursor])
            cursor += 1
        lr_s = t.lr_at(s)
        loss, gn = t.step(np.ascontiguousarray(seqs[rows]), batch, seq,
                          None if smask is None else np.ascontiguousarray(smask[rows]))
        losses.append(loss)
        taken = s + 1
        if on_progress is not None:
            el = time.time() - t0
            stop = on_progress({"step": s + 1, "steps": steps, "loss": loss, "lr": lr_s, "grad_norm": gn,
                                "tok_s": (s + 1) * per * seq / el if el > 0 else 0.0,
                                "eta_s": el / (s + 1) * (steps - s - 1)})
            if stop is True:
                break
    after = evaluate()
    t.save_adapter(out, model)
    return {"losses": losses, "eval_before": before, "eval_after": after, "steps": taken, "tokens": len(ids),
            "train_sequences": ntrain, "eval_sequences": neval, "labels": labels}


def parse_size(s: Any) -> int:
    """'256M', '4G', '1048576', 1024 -> bytes (binary units; optional 'iB'/'B').
    Only finite, non-negative sizes: nan, inf and negative numbers are refused."""
    if isinstance(s, int) and not isinstance(s, bool):
        if s < 0:
            raise InvalidArgumentError(Status.INVALID_ARG, f"bad size {s!r}")
        return s
    t = str(s).strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _SIZE_UNITS and not t[-1:].isdigit() else ""
    num = t[: len(t) - len(unit)] if unit else t
    try:
        v = float(num) * _SIZE_UNITS[unit]
        if not (0 <= v <= 9.0e18):   # also false for nan
            raise ValueError(num)
        return int(v)
    except (ValueError, OverflowError):
        raise InvalidArgumentError(Status.INVALID_ARG, f"bad size {s!r}") from None


def serve(listen: str = "127.0.0.1:13337", capacity: Any = "1G", *,
          spill_dir: Optional[str] = None, spill_capacity: Any = 0,
          token_file: Optional[str] = None, max_connections: int = 0,
          on_ready: Optional[Callable[[str], None]] = None, insecure: bool = False,
          trusted_network: bool = False, overcommit: bool = False) -> None:
    """Run a memory node (the same server as ``flextier serve``) in this
    process until KeyboardInterrupt or SIGTERM. ``listen`` port 0 picks a
    free port; ``on_ready(bound_address)`` is called once listening.
    Without ``token_file`` (a private file of >= 16 bytes) the node listens
    only on a loopback address unless ``insecure``; ``trusted_network`` lets
    UCX carry data over TCP; ``overcommit`` allows a capacity above the
    machine's memory (docs/protocol.md).
    ``python -m flextier serve --capacity 4G`` runs it from a shell."""
    err: List[BaseException] = []

    def run() -> None:
        try:
            _C.node_run(listen, parse_size(capacity), spill_dir, parse_size(spill_capacity),
                        token_file, max_connections, on_ready, insecure, trusted_network,
                        overcommit)
        except BaseException as e:  # reported in the calling thread
            err.append(e)

    th = threading.Thread(target=run, name="flextier-node", daemon=True)
    old = None
    if threading.current_thread() is threading.main_thread():
        old = signal.signal(signal.SIGTERM, lambda *_: _C.node_stop())
    th.start()
    try:
        while th.is_alive():
            th.join(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        _C.node_stop()
        th.join()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    if err:
        raise err[0]
