"""Reading a class's declared fields from source text, without importing it (for the fixture generators)."""

from __future__ import annotations

import ast


def annotated_fields(tree: ast.Module, cls: str) -> dict[str, str]:
    """{field: annotation source} of the annotated assignments in the body of class ``cls`` in ``tree``."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {s.target.id: ast.unparse(s.annotation) for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    raise SystemExit(f"{cls} not found")
