"""Small graph helpers shared by the compiler layers (no heavy imports)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, TypeVar, cast

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

__all__ = ["reachable", "strongly_connected_components"]

N = TypeVar("N", bound=Hashable)


def _sorted(xs: Iterable[N], key: Callable[[N], SupportsRichComparison] | None) -> list[N]:
    """``sorted(xs, key=key)``; without a key the nodes themselves must be comparable."""
    if key is None:
        return cast("list[N]", sorted(cast("Iterable[SupportsRichComparison]", xs)))
    return sorted(xs, key=key)


def strongly_connected_components(nodes: Iterable[N], edges: Mapping[N, Iterable[N]],
                                  key: Callable[[N], SupportsRichComparison] | None = None
                                  ) -> list[list[N]]:
    """Strongly connected components by iterative Tarjan, in reverse topological order
    (a component comes after every component it reaches). Roots are visited in the order of
    ``nodes``; successors, and the members of each component, in ``key`` order (natural
    order when None). Deterministic for a given input."""
    index: dict[N, int] = {}
    low: dict[N, int] = {}
    on: set[N] = set()
    stack: list[N] = []
    out: list[list[N]] = []

    def succ(v: N) -> Iterator[N]:
        return iter(_sorted(edges.get(v, ()), key))

    for root in nodes:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        work: list[tuple[N, Iterator[N]]] = [(root, succ(root))]
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, succ(w)))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp: list[N] = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                out.append(_sorted(comp, key))
    return out


def reachable(start: N, succ: Callable[[N], Iterable[N]]) -> set[N]:
    """The nodes reachable from ``start`` (itself included) along ``succ``."""
    seen = {start}
    todo = [start]
    while todo:
        for w in succ(todo.pop()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen
