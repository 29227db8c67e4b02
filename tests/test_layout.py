"""The layout holds: imports point down the groups of `handson/`, `handson` never
imports `autograder`, `autograder/`'s folders import as the README says, no two
modules import each other even by a detour, and the README's layout table names
every folder of both and every top-level module of `handson/`.

Read from the source with `ast` (nothing is imported), so a wrong import fails
here even in a module no other test loads.
"""

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HANDSON = ROOT / "handson"
AUTOGRADER = ROOT / "autograder"

# Lowest first: a module may import its own group or a lower one, never a higher.
# - infra: servers, loaders, process helpers; everything else stands on them.
# - lab: the reference queue, its contract and checks, and the seed's lab files
#   (the chaos engine runs the lab's worker and reuses its produce and verify).
# - machinery: fault injection and side effects, built on the lab.
# - commands: what a learner runs, and the experiments behind the chapters.
# - book: what only the chapters use; nothing else in handson may rest on it.
GROUPS = ("infra", "lab", "machinery", "commands", "book")
FOLDERS = {"infra": "infra", "queues": "lab", "faults": "machinery",
           "effects": "machinery", "bench": "commands", "book": "book"}
# Top-level modules stay where the chapters print `python -m handson.X`; the
# ones below the commands group are named here, every other one is a command.
TOP = {"__init__": "infra", "redis_server": "infra", "cluster": "infra",
       "q": "lab", "setup_db": "lab", "sink": "lab", "work": "lab",
       "produce": "lab", "worker": "lab", "verify": "lab", "app": "lab"}

# autograder/'s folders; its top holds the commands, `grade` and the registry.
# - isolation: where untrusted code runs; it imports nothing else of the grader,
#   so what confines the learner never rests on what judges them.
# - judges, notebooks: one judge per assignment; a submission as a notebook.
#   They use each other (a report's pictures, the repository's paths).
# - classroom: a whole class; only the commands (and itself) import it.
AG_FOLDERS = ("isolation", "judges", "notebooks", "classroom")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def group(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return TOP["__init__"]
    if len(parts) > 1 or (HANDSON / parts[0]).is_dir():
        if parts[0] not in FOLDERS:
            raise AssertionError(f"handson/{parts[0]}/ has no group in FOLDERS")
        return FOLDERS[parts[0]]
    return TOP.get(parts[0], "commands")


def imports(source: str, module: str, is_package: bool) -> set[str]:
    """The dotted names a module imports (`from a import b` gives a and a.b)."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = package.rsplit(".", node.level - 1)[0]
                mod = f"{base}.{mod}" if mod else base
            names.add(mod)
            names |= {f"{mod}.{a.name}" for a in node.names}
    return names


def in_package(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def autograder_violation(module: str, name: str) -> str:
    """Why `module` (in autograder) may not import `name` ('' if it may)."""
    if in_package(module, "autograder.isolation") and name.startswith(
            "autograder.") and not in_package(name, "autograder.isolation"):
        return (f"{module} imports {name}: isolation imports nothing else "
                "of the grader")
    if in_package(name, "autograder.classroom") and module != "autograder.cli" \
            and not in_package(module, "autograder.classroom"):
        return (f"{module} imports {name}: only the commands (autograder.cli) "
                "import classroom")
    return ""


def violations(module: str, imported: set[str], known: set[str]) -> list[str]:
    """What is wrong with one module's imports; `known`: the handson modules."""
    found = []
    for name in sorted(imported):
        top = name.split(".")[0]
        if module.startswith("handson") and top == "autograder":
            found.append(f"{module} imports {name}: handson never imports autograder")
        if in_package(module, "autograder") and (why := autograder_violation(
                module, name)):
            found.append(why)
        if not (module.startswith("handson.") or module == "handson"):
            continue
        if top != "handson" or name not in known:
            continue            # `from handson import q` also gives `handson`
        mine, theirs = group(module), group(name)
        if GROUPS.index(theirs) > GROUPS.index(mine):
            found.append(f"{module} ({mine}) imports {name} ({theirs}): "
                         f"imports point down {' <- '.join(GROUPS)}")
    return found


def sources() -> dict[str, tuple[Path, str]]:
    files = sorted(HANDSON.rglob("*.py")) + sorted(AUTOGRADER.rglob("*.py"))
    return {module_name(p): (p, p.read_text()) for p in files}


def test_imports_point_down_and_handson_never_imports_autograder():
    src = sources()
    known = set(src)
    found = [v for mod, (path, text) in src.items()
             for v in violations(mod, imports(text, mod, path.name == "__init__.py"),
                                 known)]
    assert not found, "\n".join(found)


def test_the_checker_catches_a_wrong_direction():
    """The check can fail: a synthetic infra module importing up, and autograder."""
    known = set(sources())
    text = ("from handson import chaos\nimport autograder.isolation.sandbox\n"
            "from handson.redis_server import die_with_parent\n")
    found = violations("handson.infra.pg_server",
                       imports(text, "handson.infra.pg_server", False), known)
    assert len(found) == 2, found
    assert any("imports handson.chaos (commands)" in f for f in found)
    assert any("never imports autograder" in f for f in found)
    up = violations("handson.queues.checks",
                    imports("from ..book import sim\n", "handson.queues.checks",
                            False), known)
    assert any("imports handson.book.sim (book)" in f for f in up), up


def test_the_checker_catches_autograder_folders_importing_wrongly():
    text = ("from autograder.judges import checks\nfrom .. import assignments\n"
            "from autograder.isolation import landlock\nimport handson.q\n")
    found = violations("autograder.isolation.confine",
                       imports(text, "autograder.isolation.confine", False), set())
    assert sorted(f.split(" imports ")[1].split(":")[0] for f in found) == [
        "autograder.assignments", "autograder.judges", "autograder.judges.checks"]
    text = "from autograder.classroom import term\n"
    found = violations("autograder.notebooks.feedback",
                       imports(text, "autograder.notebooks.feedback", False), set())
    assert len(found) == 2 and "only the commands" in found[0], found
    for mine in ("autograder.cli", "autograder.classroom.export"):
        assert not violations(mine, imports(text, mine, False), set())


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph` (module -> the modules it imports): each a
    path that ends where it starts, one per circle found."""
    found, done = [], set()

    def walk(module: str, path: list[str]) -> None:
        for name in sorted(graph.get(module, ())):
            if name in path:
                found.append(path[path.index(name):] + [name])
            elif name not in done:
                walk(name, path + [name])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            walk(module, [module])
    return found


def import_graph() -> dict[str, set[str]]:
    """Every module's imports of the course's own modules, also those inside a
    function: a late import still ties the two together."""
    src = sources()
    return {mod: {n for n in imports(text, mod, path.name == "__init__.py")
                  if n in src and n != mod}
            for mod, (path, text) in src.items()}


def test_no_import_circle():
    found = cycles(import_graph())
    assert not found, "import circles (move what both need below both):\n" + \
        "\n".join(" -> ".join(c) for c in found)


def test_the_circle_check_catches_one():
    graph = import_graph()
    graph["autograder.judges.results"] = graph["autograder.judges.results"] | {
        "autograder.notebooks.feedback"}
    found = cycles(graph)
    assert any("autograder.notebooks.feedback" in c and
               "autograder.judges.results" in c for c in found), found


def packages(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and (p / "__init__.py").exists())


def layout_rows(readme: Path) -> set[str]:
    table = readme.read_text().split("## Layout", 1)[1]
    return set(re.findall(r"^\| `([\w/]+)` \|", table, re.M))


def test_every_folder_is_a_group_and_in_the_readme_table():
    folders = packages(HANDSON)
    assert set(folders) == set(FOLDERS), "FOLDERS must name each folder of handson/"
    rows = layout_rows(ROOT / "README.md")
    missing = [f"handson/{f}/" for f in folders if f"handson/{f}/" not in rows]
    assert "handson/" in rows and not missing, f"README layout table lacks {missing}"


def test_the_readme_names_every_top_level_module_of_handson():
    table = (ROOT / "README.md").read_text().split("## Layout", 1)[1]
    row = re.search(r"^\| `handson/` \|(.*)$", table, re.M).group(1)
    named = {n.removesuffix(".py") for n in re.findall(r"`([\w.]+)`", row)}
    modules = {p.stem for p in HANDSON.glob("*.py")} - {"__init__"}
    missing = sorted(modules - named)
    assert not missing, f"README's handson/ row lacks {missing}"


def test_every_autograder_folder_is_named_and_in_both_layout_tables():
    folders = packages(AUTOGRADER)
    assert set(folders) == set(AG_FOLDERS), \
        "AG_FOLDERS must name each folder of autograder/"
    rows = layout_rows(ROOT / "README.md")
    missing = [f"autograder/{f}/" for f in folders if f"autograder/{f}/" not in rows]
    assert "autograder/" in rows and not missing, \
        f"README layout table lacks {missing}"
    rows = layout_rows(AUTOGRADER / "README.md")
    missing = [f"{f}/" for f in folders if f"{f}/" not in rows]
    assert not missing, f"autograder/README.md's layout table lacks {missing}"


def test_no_folder_or_module_shadows_the_standard_library():
    """`c01_job_scheduler.py` runs by path, which puts handson/ on sys.path: a
    `handson/queue/` there would replace the standard library's `queue`."""
    names = {p.stem for p in HANDSON.iterdir() if p.suffix == ".py" or p.is_dir()}
    assert not names & set(sys.stdlib_module_names)
