# Type stub for the slice of numba that structgen uses: ``njit`` keeps the decorated
# function's signature, so strict mypy still checks the kernels' callers.
from typing import Any, Callable, TypeVar, overload

from numba import types as types

_F = TypeVar("_F", bound=Callable[..., Any])

@overload
def njit(func: _F, /) -> _F: ...
@overload
def njit(*args: Any, **kwargs: Any) -> Callable[[_F], _F]: ...
def __getattr__(name: str) -> Any: ...
