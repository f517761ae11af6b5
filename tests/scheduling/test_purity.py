"""scheduling/ stays pure Python: no Django, Celery, Kubernetes or portal imports."""

from __future__ import annotations

import ast
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "scheduling"
FORBIDDEN = ("django", "celery", "kombu", "kubernetes", "rest_framework", "portal")


def imported_modules(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


class PurityTest(unittest.TestCase):
    def test_it_imports_nothing_forbidden(self) -> None:
        files = sorted(ROOT.rglob("*.py"))
        self.assertTrue(files)
        for path in files:
            with self.subTest(path=str(path.relative_to(ROOT.parent))):
                tree = ast.parse(path.read_text(), filename=str(path))
                bad = [m for m in imported_modules(tree) if m.split(".")[0] in FORBIDDEN]
                self.assertEqual(bad, [])

    def test_only_the_benchmarks_import_the_benchmarks(self) -> None:
        # the replay simulator the what-if runs is scheduling/simulate.py, not the bench
        files = sorted(p for p in ROOT.rglob("*.py") if "bench" not in p.relative_to(ROOT).parts)
        self.assertTrue(files)
        for path in files:
            with self.subTest(path=str(path.relative_to(ROOT.parent))):
                tree = ast.parse(path.read_text(), filename=str(path))
                bad = [m for m in imported_modules(tree) if m.startswith("scheduling.bench")]
                self.assertEqual(bad, [])

    def test_it_catches_a_forbidden_import(self) -> None:
        tree = ast.parse("import django.db\nfrom portal.models import X\nfrom . import y\n")
        self.assertEqual(imported_modules(tree), ["django.db", "portal.models"])
