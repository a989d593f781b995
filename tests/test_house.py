"""The house rules a reader of the packages relies on, checked over the source."""

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "engine", "judges", "routers", "orchestrator", "workflows")

# A bench figure: a throughput, or a speed ratio / timing / share stated as measured.
THROUGHPUT = re.compile(r"\d[\d.,]*\s*tok/s")
FIGURE = re.compile(r"\d[\d.,]*\s*(?:x|×|s|ms|seconds?|%)(?![\w-])")
MEASURED = re.compile(r"\bmeasur|\bthis (?:CPU|machine)\b|\bbenchmarks/measured\b|\bon (?:an? )?(?:AMD|Intel|EPYC|Xeon)\b")


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in ``path``."""
    source = path.read_text()
    found = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
             if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((node.body[0].lineno, doc))
    return found


EXAMPLE = re.compile(r"\b(?:Worked example|Example|example:)")


def bench_figures(text: str) -> list[str]:
    """The sentences of ``text`` that state a bench figure; a paragraph's worked example (from
    "Example" to the paragraph's end) states made-up figures, and passes."""
    paragraphs = [EXAMPLE.split(p, maxsplit=1)[0] for p in re.split(r"\n\s*\n", text)]
    sentences = [s for p in paragraphs for s in re.split(r"(?<=[.;])\s+", " ".join(p.split()))]
    return [s for s in sentences if THROUGHPUT.search(s) or (FIGURE.search(s) and MEASURED.search(s))]


def test_the_check_finds_bench_figures_and_passes_worked_examples():
    assert bench_figures("the 0.5B decodes fastest with suffix decoding (24.4 tok/s; none 16.4)")
    assert bench_figures("Binding threads measured ~1.6x faster than vLLM's binding.")
    assert bench_figures("a verification costs 0.32 s against 0.55 on this CPU")
    assert not bench_figures("Example: one trace of 10 s, a drafted step of 40 tokens in 2 s.")
    assert not bench_figures("The default chosen in engines_cpu: suffix decoding.")


def test_no_bench_figure_in_a_docstring_or_comment_of_the_packages():
    """Figures go stale with every run; code cites the committed run that chose a default by
    its folder name, and its report holds the figures."""
    found = [f"{path.relative_to(ROOT)}:{line}: {sentence}"
             for package in PACKAGES for path in sorted((ROOT / "stepspec" / package).rglob("*.py"))
             for line, text in _prose(path) for sentence in bench_figures(text)]
    assert not found, "bench figures in code (cite the run's folder instead):\n" + "\n".join(found)


# Strings that name a role (stepspec.common.states.Author), a run's state (stepspec.common.states.RunStatus) or a
# token method (stepspec.engine.speculation.TokenMethod): code compares the enum members instead.
NAMED_BY_ENUMS = {"draft", "target", "running", "complete", "incomplete", "interrupted", "failed",
                  "ngram", "suffix"}  # not "none": tool_choice has one too


def _string_comparisons(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            values = [e for side in sides for e in ([side] if not isinstance(side, (ast.Tuple, ast.Set, ast.List))
                                                     else side.elts)]
            found += [(node.lineno, v.value) for v in values
                      if isinstance(v, ast.Constant) and v.value in NAMED_BY_ENUMS]
    return found


def test_the_comparison_check_finds_a_role_or_state_compared_as_a_string():
    assert _string_comparisons(ast.parse('x = record.author == "draft"\ny = s in ("complete", "failed")'))
    assert not _string_comparisons(ast.parse('x = record.author is Author.DRAFT\ny = d["draft"]'))


def test_roles_states_and_token_methods_are_compared_as_enum_members():
    found = [f"{path.relative_to(ROOT)}:{line}: {value!r}"
             for package in PACKAGES for path in sorted((ROOT / "stepspec" / package).rglob("*.py"))
             for line, value in _string_comparisons(ast.parse(path.read_text()))]
    assert not found, "compare Author / RunStatus / TokenMethod members, not strings:\n" + "\n".join(found)


def test_no_class_name_is_declared_twice():
    seen: dict[str, str] = {}
    twice = []
    for package in PACKAGES:
        for path in sorted((ROOT / "stepspec" / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    if node.name in seen:
                        twice.append(f"{node.name}: {seen[node.name]} and {where}")
                    seen.setdefault(node.name, where)
    assert len(seen) > 100 and twice == []


ROLES = {"draft", "target"}


def _string_roles(source: str) -> list[int]:
    """Lines where code names a role by its string: a subscript, a ``.get`` or ``==`` with "draft" or
    "target", or a dict keyed by roles (roles are ``Author`` members; a record whose fields are
    named after them, ``{"seed": ..., "target": ..., "draft": ...}``, is not)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        texts = []
        if isinstance(node, ast.Subscript):
            texts = [node.slice]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            texts = node.args[:1]
        elif isinstance(node, ast.Compare):
            texts = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):  # keyed by role: most of its keys are roles (not a record of fields)
            keys = [k for k in node.keys if isinstance(k, ast.Constant)]
            texts = keys if 2 * sum(k.value in ROLES for k in keys) > len(keys) else []
        lines += [t.lineno for t in texts if isinstance(t, ast.Constant) and t.value in ROLES]
    return lines


def test_roles_are_author_members_not_strings():
    assert _string_roles('x = engines["draft"]\ny = d.get("target")\nz = {"draft": 1}\nw = role == "target"\n') == \
        [1, 2, 3, 4]
    found = [f"{path.relative_to(ROOT)}:{line}" for package in PACKAGES
             for path in sorted((ROOT / "stepspec" / package).rglob("*.py")) for line in _string_roles(path.read_text())]
    assert found == []
