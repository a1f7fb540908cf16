"""Type stubs for the low-level extension (use the ``flextier`` package)."""
from typing import Any, Callable, Dict

LIB_VERSION: str
DT_F32: int
DT_F16: int
DT_BF16: int
DT_I8: int
DT_U8: int
DT_I32: int
OK: int
ERR_INVALID_ARG: int
ERR_NOMEM: int
ERR_CORRUPT: int
ERR_UNSUPPORTED: int
ERR_IO: int
ERR_NOT_FOUND: int
ERR_NO_SPACE: int
ERR_BUFFER_SMALL: int
ERR_AUTH: int
ERR_NET: int
ERR_TIMEOUT: int
ERR_PROTOCOL: int
ERR_BUSY: int
ERR_EXISTS: int
ERR_CANCELED: int
ERR_INTERNAL: int
DEFAULT_CHUNK_SIZE: int
MIN_CHUNK_SIZE: int
MAX_CHUNK_SIZE: int
DEFAULT_GROUP_SIZE: int
MAX_DIMS: int

def encode(data: Any, dtype: int = -1, codec: str = "zstd", level: int = 0,
           group_size: int = 64, group_dim: int = -1, chunk_size: int = 0,
           threads: int = 0) -> bytes: ...
def decode_into(frame: Any, out: Any, dtype: int = -1, threads: int = 0) -> None: ...
def frame_info(frame: Any, partial: bool = False) -> Dict[str, Any]: ...
def status_str(status: int) -> str: ...
def default_threads() -> int: ...
def ctx_threads() -> int: ...
def _set_error_factory(factory: Callable[[int, str], BaseException]) -> None: ...
