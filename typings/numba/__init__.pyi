# Type stub for the slice of numba that structgen uses: ``njit`` keeps the decorated
# function's signature, so strict mypy still checks the kernels' callers.
from collections.abc import Callable
from typing import Any, TypeVar, overload

from numba import types as types

_F = TypeVar("_F", bound=Callable[..., object])

@overload
def njit(func: _F, /) -> _F: ...
@overload
def njit(*, cache: bool = ..., nogil: bool = ..., parallel: bool = ...,
         fastmath: bool = ...) -> Callable[[_F], _F]: ...
def __getattr__(name: str) -> Any: ...
