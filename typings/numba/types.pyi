from typing import Any

class Type:
    # ``t[::1]``, ``t[:, ::1]``: the C-contiguous array type of this dtype
    def __getitem__(self, key: object) -> Type: ...

class StructRef(Type):
    def __init__(self, fields: list[tuple[str, Type]]) -> None: ...

def unliteral(lit_type: Type) -> Type: ...

int8: Type
int32: Type
int64: Type
uint8: Type
uint64: Type
boolean: Type

def __getattr__(name: str) -> Any: ...
