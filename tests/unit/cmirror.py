"""ctypes mirrors of the lab's C structs, checked against the compiler's own layout.

Why: a mirror that drifts from its header reads or writes the wrong bytes silently. The
compiler is asked, for each mirrored field, its type (``_Generic``: a wrong name or type
does not compile), its offset, and each struct's size; the test compares those with what
ctypes computed for the mirror.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

from controllers import cbuild

#: The C type each ctypes field type stands for.
C_TYPES: dict[type, str] = {
    ctypes.c_uint8: "uint8_t", ctypes.c_uint16: "uint16_t", ctypes.c_uint32: "uint32_t",
    ctypes.c_uint64: "uint64_t", ctypes.c_double: "double", ctypes.c_int: "int"}


def layout_mismatch(header: Path, structs: list[tuple[str, type[ctypes.Structure]]],
                    tmp_path: Path, c_types: dict[type, str] | None = None) -> list[str]:
    """What differs between the mirrors in ``structs`` ((C struct name, mirror)) and the
    compiler's layout of them from ``header``: empty when they agree. ``c_types`` adds C
    names for field types beyond :data:`C_TYPES` (a nested struct's mirror)."""
    names = {**C_TYPES, **(c_types or {})}
    asserts: list[str] = []
    items: list[tuple[str, int]] = []       # (what, ctypes' value)
    for struct, mirror in structs:
        items.append((f"sizeof(struct {struct})", ctypes.sizeof(mirror)))
        for name, ctype in mirror._fields_:
            asserts.append(f"_Static_assert(_Generic(((struct {struct} *)0)->{name}, "
                         f'{names[ctype]}: 1, default: 0), "{struct}.{name}");')
            items.append((f"offsetof(struct {struct}, {name})", getattr(mirror, name).offset))
    got = compiler_values(header, [what for what, _ in items], tmp_path, asserts)
    return [f"{what}: compiler {g}, mirror {want}"
            for (what, want), g in zip(items, got, strict=True) if g != want]


def compiler_values(header: Path, exprs: list[str], tmp_path: Path,
                    asserts: Sequence[str] = ()) -> list[int]:
    """The values of ``exprs`` (sizeof, offsetof: size_t constants) as the compiler
    computes them with ``header`` included, checked by ``asserts`` (static assertions)."""
    lines = ["#include <stddef.h>", f'#include "{header.name}"', *asserts,
             f"const size_t layout[] = {{ {', '.join(exprs)} }};"]
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / f"{header.stem}_layout.c"
    src.write_text("\n".join(lines) + "\n")
    so = cbuild.build(f"{header.stem}-layout", [src], shared=True,
                      flags=["-I", str(header.parent)], build_dir=tmp_path / "build")
    return list((ctypes.c_size_t * len(exprs)).in_dll(ctypes.CDLL(str(so)), "layout"))
