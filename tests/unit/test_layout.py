"""The house rules a reader relies on: short functions, docs that speak of the product, and
flags that come from one definition."""

from __future__ import annotations

import ast
import dataclasses
import io
import re
import tokenize
from pathlib import Path

import pytest

from cli import build_parser
from eval.bench.options import BenchOptions
from eval.options import FINETUNE_ROLES, EvalOptions, EvalTarget, FinetuneOptions
from ragrank.options import cli_fields, flag_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cli", "ragrank", "server", "indexing", "eval")
LONGEST_FUNCTION = 80
#: Words about how the code was written rather than about the product: issue numbers, work
#: sessions, machines that were or were not lent, and paths of one particular machine.
BUILD_TALK = re.compile(
    r"\bissues? #?\d+\b|\b(?:the|this|that) issue\b|\bsession that\b|\b(?:the|this) session\b"
    r"|\bsession's\b|\bwas lent\b|\blent to\b|\bproof the issue\b|/work/|/root/|/home/\w",
    re.IGNORECASE,
)


def _python_files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _markdown_files() -> list[Path]:
    """The repository's own documents, not those of the packages installed in virtualenvs."""
    folders = ("docs", *PACKAGES, "tests")
    return sorted({*ROOT.glob("*.md"), *(p for f in folders for p in (ROOT / f).rglob("*.md"))})


def test_no_function_is_longer_than_80_lines():
    long = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert not long, long


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each comment and docstring of a Python file."""
    source = path.read_text(encoding="utf-8")
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((node.body[0].lineno, doc))
    return found


def test_docs_and_comments_speak_of_the_product_only():
    found = []
    for path in _markdown_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if BUILD_TALK.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    for path in [*_python_files(), *sorted((ROOT / "tests").rglob("*.py"))]:
        for number, text in _prose(path):
            if match := BUILD_TALK.search(text):
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("phrase", ["as issue 3 asks", "the session that wrote this", "/work/x"])
def test_the_build_talk_check_catches_its_phrases(phrase: str):
    assert BUILD_TALK.search(phrase)


def _flags(parser: object) -> dict[str, object]:
    """Option string → argparse action, for one (sub)parser."""
    return {
        option: action
        for action in parser._actions  # type: ignore[attr-defined]
        if action.option_strings
        for option in action.option_strings
    }


def _subparser(*path: str) -> object:
    parser: object = build_parser()
    for name in path:
        action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")  # type: ignore[attr-defined]
        parser = action.choices[name]
    return parser


def _expected(options: type[object]) -> set[str]:
    flags = set()
    for field in cli_fields(options):
        flags.add(flag_name(field))
        if field.metadata["none_flag"]:
            flags.add(field.metadata["none_flag"][0])
    return flags


COMMON = {"--preset", "--embed-model", "--rerank-model", "--qdrant-path", "--qdrant-url"}
COMMON |= {"--collection", "--device", "--cascade", "--rerank-blend", "-h", "--help"}


@pytest.mark.parametrize(
    ("path", "options"),
    [
        (("eval",), (EvalTarget, EvalOptions)),
        (("finetune", "reranker"), (FinetuneOptions,)),
        (("finetune", "embedder"), (FinetuneOptions,)),
        (("bench",), (BenchOptions,)),
    ],
)
def test_each_commands_flags_are_its_options_fields(path, options):
    flags = _flags(_subparser(*path))
    expected = set().union(*(_expected(o) for o in options))
    common = COMMON if path[0] != "bench" else {"-h", "--help"}
    assert set(flags) - common == expected
    for option in options:
        for field in cli_fields(option):
            action = flags[flag_name(field)]
            assert action.dest == field.name  # type: ignore[attr-defined]
            assert action.help.startswith(field.metadata["help"])  # type: ignore[attr-defined]


@pytest.mark.parametrize("role", sorted(FINETUNE_ROLES))
def test_finetune_defaults_are_the_dataclass_or_the_roles(role: str):
    spec = FINETUNE_ROLES[role]
    parser = _subparser("finetune", role)
    args = parser.parse_args(["--dataset", "d", "--output", "o"])  # type: ignore[attr-defined]
    for field in cli_fields(FinetuneOptions):
        if field.default is dataclasses.MISSING or field.name in {"dataset", "output"}:
            continue
        assert getattr(args, field.name) == spec.defaults.get(field.name, field.default)
    assert _flags(parser)["--loss"].choices == spec.losses  # type: ignore[attr-defined]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)}


def test_every_link_between_the_docs_reaches_a_file_and_a_heading():
    broken = []
    for path in _markdown_files():
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if not linked.exists() or (anchor and anchor not in _anchors(linked)):
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, broken


def _cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in imports.get(module, ()):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(imports):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_back_through_any_chain_lazy_imports_included():
    """import-linter's `acyclic_siblings` sees cycles between siblings only; a package that
    imports its own child, which imports the package back, passes it. grimp's graph holds every
    import statement, those inside functions and under TYPE_CHECKING included."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    assert _cycles(imports) == []


def test_the_cycle_check_finds_a_package_importing_its_child_back():
    assert _cycles({"p": {"p.child"}, "p.child": {"p"}, "q": {"p"}}) == [["p", "p.child"]]
