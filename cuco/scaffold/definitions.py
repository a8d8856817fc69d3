"""Every name's definitions in a program: the values each local, global and field of the program's state is given,
and which of them are changed in place, so that a size can be followed to the one value a name holds.

A name given two different values, or updated after it is given one (`n += k`, `n++`, `&n`), has no one definition:
it is UNSURE, and a size built on it is never passed off as known.
"""

from __future__ import annotations

from cuco.fastpath.syntax import function_name, text, walk
from cuco.scaffold.declarations import declared_name, initializer, parameters

UNSURE = object()  # a name defined more than once, or changed after its definition


class Definitions:
    """The program's definitions, by function ("" for file scope) and name, and of its state's fields."""

    def __init__(self, root, functions: list) -> None:
        self.defs: dict[str, dict[str, list]] = {}  # function -> name -> values it is given (declared or assigned)
        self.changed: dict[str, set[str]] = {}  # function -> names updated in place (+=, ++, &name)
        self.declared: dict[str, set[str]] = {}
        self.fields: dict[str, list[tuple[str, object]]] = {}  # field -> (function, value) of each `x->f = v`
        self.changed_fields: set[str] = set()
        for decl in (n for n in root.named_children if n.type == "declaration"):
            self._declare(decl, "")  # file scope: `constexpr int kVec = 8;`
        for fn in functions:
            self._read_function(fn)

    def _read_function(self, fn) -> None:
        fname = function_name(fn)
        self.declared.setdefault(fname, set()).update(p.name for p in parameters(fn))
        for node in walk(fn):
            if node.type == "declaration":
                self._declare(node, fname)
            elif node.type == "assignment_expression":
                self._assign(node, fname)
            elif node.type == "update_expression" or (node.type == "pointer_expression" and text(node)[:1] == "&"):
                self._update(node, fname)

    def _declare(self, decl, fname: str) -> None:
        for d in decl.named_children:
            target = d.child_by_field_name("declarator") if d.type == "init_declarator" else d
            name = declared_name(target) if d.type in ("init_declarator", "identifier", "pointer_declarator") \
                else None
            if name is None:
                continue
            self.declared.setdefault(fname, set()).add(name)
            value = initializer(d.child_by_field_name("value")) if d.type == "init_declarator" else None
            if value is not None:
                self.defs.setdefault(fname, {}).setdefault(name, []).append(value)

    def _assign(self, node, fname: str) -> None:
        left, op = node.child_by_field_name("left"), node.child_by_field_name("operator")
        right = node.child_by_field_name("right")
        if left is None or op is None:
            return
        if left.type == "identifier":
            if text(op) == "=" and right is not None:
                self.defs.setdefault(fname, {}).setdefault(text(left), []).append(right)
            else:
                self.changed.setdefault(fname, set()).add(text(left))
        elif left.type == "field_expression" and left.child_by_field_name("field") is not None:
            fld = text(left.child_by_field_name("field"))
            if text(op) == "=" and right is not None:
                self.fields.setdefault(fld, []).append((fname, right))
            else:
                self.changed_fields.add(fld)

    def _update(self, node, fname: str) -> None:
        """`n++`, `s->n += k`, `&n` (written through its address): no single definition any more."""
        target = node.child_by_field_name("argument")
        if target is None:
            return
        if target.type == "identifier":
            self.changed.setdefault(fname, set()).add(text(target))
        elif target.type == "field_expression" and target.child_by_field_name("field") is not None:
            self.changed_fields.add(text(target.child_by_field_name("field")))

    def definition(self, fname: str, name: str):
        """(function, value) of the one definition of a name used in fname, UNSURE, or None if it has none: a
        local's in fname, else a global's, wherever a function assigns it without declaring its own."""
        if name in self.declared.get(fname, set()) or name in self.defs.get(fname, {}):
            if name in self.changed.get(fname, set()):
                return UNSURE
            return self._pick([(fname, v) for v in self.defs.get(fname, {}).get(name, [])])
        shared = [f for f in self.defs.keys() | self.changed.keys() if f == "" or name not in self.declared.get(f, ())]
        if any(name in self.changed.get(f, set()) for f in shared):
            return UNSURE
        return self._pick([(f, v) for f in shared for v in self.defs.get(f, {}).get(name, [])])

    def field_definition(self, fld: str):
        """(function, value) of the one assignment of a field of the program's state (`s->n = ...`)."""
        if fld in self.changed_fields:
            return UNSURE
        return self._pick(self.fields.get(fld, []))

    @staticmethod
    def _pick(found: list):
        if not found:
            return None
        if len({" ".join(text(v).split()) for _, v in found}) > 1:
            return UNSURE
        return found[0]
