"""Which values share storage, and which ops read a buffer that another op later writes in place.

Plain data: ops are ``(kind, tags, inputs, outputs)`` records (tags from :func:`remat.core.ops.op_tags`).
Views, ``update_aliases`` and ``copy_`` link storage.  Used by the fusion stand-in (what may not join a
region) and by the IR (what may not be recomputed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from remat.core.ops import MUTATING_KINDS

__all__ = ["OpRecord", "written_buffer", "mutated_storage", "mutation_hazards"]


def written_buffer(kind: str, tags: Iterable[str], inputs: Sequence[str]) -> str | None:
    """The name of the buffer an op writes in place: ``copy_(src, dst)`` writes ``dst``; a Thunder
    ``IN_PLACE`` symbol its first argument.  None for other ops."""
    if kind in MUTATING_KINDS:
        return inputs[1] if len(inputs) > 1 else None
    if "mutates" in tags and inputs:
        return inputs[0]
    return None


class _Storage:
    """Union-find over value names: names in one set may share storage."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, name: str) -> str:
        parent = self.parent
        root = name
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(name, name) != root:  # path compression
            parent[name], name = root, parent[name]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


OpRecord = tuple  # (kind, tags, inputs, outputs): plain data for the functions below


def _storage_and_writes(records: Sequence[OpRecord]) -> tuple[_Storage, dict[str, tuple[int, str]]]:
    """Storage sets and, per set (its root), the position and kind of the last op writing it in place."""
    storage = _Storage()
    writes: list[tuple[int, str, str]] = []
    for position, (kind, tags, inputs, outputs) in enumerate(records):
        written = written_buffer(kind, tags, inputs)
        if written is not None:
            writes.append((position, written, kind))
            for out in outputs:
                storage.union(out, written)  # copy_ returns its destination
        elif kind == "update_aliases" and inputs:  # its arguments may alias each other; outputs are them
            for name in (*inputs, *outputs):
                storage.union(name, inputs[0])
        elif "view" in tags and inputs:
            for out in outputs:
                storage.union(out, inputs[0])
    last: dict[str, tuple[int, str]] = {}
    for position, written, kind in writes:
        root = storage.find(written)
        if root not in last or last[root][0] < position:
            last[root] = (position, kind)
    return storage, last


def mutated_storage(records: Sequence[OpRecord]) -> set[str]:
    """Names (read or written by ``records``) that may share storage with a buffer some op writes in
    place.  ``records``: ``(kind, tags, inputs, outputs)`` per op, tags from :func:`op_tags`.  Views,
    ``update_aliases`` and ``copy_`` link storage; an over-approximation (views inside regions count too)."""
    if not any("mutates" in r[1] for r in records):
        return set()
    storage, last = _storage_and_writes(records)
    names = {n for r in records for n in (*r[2], *r[3])}
    return {n for n in names if storage.find(n) in last}


def mutation_hazards(records: Sequence[OpRecord]) -> dict[int, str]:
    """Positions of the ops that read a value sharing storage with a buffer that an op *later in*
    ``records`` writes in place, each with the kind of that op.  ``records`` are in execution order.
    Recomputing such an op after the write would read the new contents, so it must stay where it is.
    Ops of the in-place family themselves are left out (they are never recomputed anyway)."""
    if not any("mutates" in r[1] for r in records):
        return {}
    storage, last = _storage_and_writes(records)
    hazards: dict[int, str] = {}
    for position, (kind, tags, inputs, _outputs) in enumerate(records):
        if "in_place" in tags:
            continue
        for name in inputs:
            write = last.get(storage.find(name))
            if write is not None and write[0] > position:
                hazards[position] = write[1]
                break
    return hazards


