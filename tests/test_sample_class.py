"""The class `bench --class` grades: mixed as the issue asks, each wrong queue the
corpus's own, and the progress bar's estimate read against what was left."""

import ast
import collections
from pathlib import Path

import nbformat

from autograder.classroom import class_bench, sample_class


def test_a_class_is_a_third_correct_a_third_wrong_and_a_third_the_rest(tmp_path):
    made = sample_class.compose(tmp_path / "submitted", 30)
    kinds = collections.Counter(kind for _, kind in made.values())
    assert kinds == {"correct": 10, "wrong": 10, "untouched": 4, "broken": 3,
                     "hanging": 3}
    order = [kind for _, kind in made.values()]
    assert order != sorted(order, key=sample_class.KINDS.index)     # shuffled
    for student, (name, kind) in made.items():
        path = (tmp_path / "submitted" / student / "claim_ack_reap" /
                "claim_ack_reap.ipynb")
        if name == "cut_short":
            continue                    # not a notebook: that is its point
        nb = nbformat.read(str(path), 4)
        if kind == "hanging":
            assert nb.cells[-1].source == sample_class.HANGS[name]


def _mutants() -> list[Path]:
    return sample_class.mutants()


def test_every_wrong_queue_of_the_corpus_is_in_a_large_class(tmp_path):
    one_cell = {p.stem for p in _mutants() if not sample_class.imports_a_sibling(p)}
    made = sample_class.compose(tmp_path / "submitted", 300)
    handed = {name.removeprefix("queue_") for name, _ in made.values()}
    assert len(one_cell) >= len(_mutants()) - 1 >= 20 and one_cell <= handed


def test_each_wrong_queue_in_a_module_cell_imports_alone(tmp_path):
    """As `myqueue.py` in a folder of its own, with none of the corpus beside it."""
    import importlib.util
    for path in _mutants():
        if sample_class.imports_a_sibling(path):
            continue
        module = tmp_path / f"{path.stem}.py"
        module.write_text(sample_class.inlined(path))
        spec = importlib.util.spec_from_file_location(path.stem, module)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _functions(source: str) -> dict[str, str]:
    return {n.name: ast.dump(n) for n in ast.parse(source).body
            if isinstance(n, ast.FunctionDef)}


def test_a_wrong_queue_in_the_module_cell_is_that_queue(tmp_path):
    """Inlined, a mutant is its base with its own functions last: each of its
    functions wins over the base's of that name, unchanged."""
    for path in _mutants():
        text = sample_class.inlined(path)
        assert "sys.path.insert" not in text and "import *" not in text
        own = _functions(path.read_text())
        tree = ast.parse(text)
        last = {}
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                last[node.name] = ast.dump(node)
        assert own and all(last[name] == body for name, body in own.items()), path


def test_the_estimate_is_read_at_each_fraction_of_the_class():
    heard = [(0.0, "[.....] 0/10 graded, 2 running, 0 failed, time left: after"),
             (10.0, "[##...] 1/10 graded, 2 running, 0 failed, ~90 s left"),
             (30.0, "[####.] 3/10 graded, 2 running, 0 failed, ~70 s left"),
             (60.0, "[#####] 5/10 graded, 2 running, 0 failed, ~60 s left"),
             (95.0, "[#####] 8/10 graded, 2 running, 0 failed, ~24 s left"),
             (100.0, "graded")]
    got = class_bench.estimates(heard, end=120.0)
    assert got == [{"done": 0.1, "said_s": 90, "was_s": 110.0},
                   {"done": 0.3, "said_s": 70, "was_s": 90.0},
                   {"done": 0.5, "said_s": 60, "was_s": 60.0},
                   {"done": 0.8, "said_s": 24, "was_s": 25.0}]
    # the time left runs to the last grade, not to the command's end
    done = [*heard, (110.0, "[#####] 10/10 graded, 0 running, 0 failed, ~0 s left")]
    assert class_bench.estimates(done, end=130.0)[-1]["was_s"] == 15.0
    # a class of 3: one reading stands for both fractions it passes
    three = [(5.0, "[#..] 1/3 graded, 1 running, 0 failed, ~20 s left"),
             (9.0, "[###] 3/3 graded, 0 running, 0 failed, ~0 s left")]
    assert [e["done"] for e in class_bench.estimates(three, end=9.0)] == [0.33, 1.0]


def test_scores_come_from_the_class_csv(tmp_path):
    (tmp_path / "grades.csv").write_text(
        "student,assignment,sha256,score,max_score,grade_s,checks\n"
        "s001,claim_ack_reap,ab,29,29,12.5,x=1\n")
    assert class_bench.scores(tmp_path) == {"s001": (29.0, 29.0, 12.5, {"x": 1.0})}
    assert class_bench.scores(Path(tmp_path / "none")) == {}


def test_points_apart_from_grading_alone_are_named_by_check():
    alone = {"a": 1.0, "chaos": 2.0}
    same = (3.0, 3.0, 1.0, {"a": 1.0, "chaos": 2.0})
    lucky = (1.0, 3.0, 1.0, {"a": 1.0, "chaos": 0.0})
    assert class_bench.differences(alone, [same, same]) == {}
    assert class_bench.differences(alone, [same, lucky]) == {"chaos": [2.0, 2.0, 0.0]}
    assert class_bench.differences(None, [same]) == {"grade": [False, True]}
    assert class_bench.differences(alone, [None]) == {"grade": [True, False]}
    assert class_bench.differences(None, [None, None]) == {}


def test_a_submission_grade_class_could_not_grade_is_named_with_why():
    """The bench reads grade-class's own report: which student, and why."""
    from autograder.classroom import grade_class

    run = grade_class.ClassRun(failed={
        "s007/claim_ack_reap@0123456789ab": "KilledWorker: its grader was killed"})
    said = grade_class.report(run)
    assert class_bench.not_graded(said) == [
        ("s007", "KilledWorker: its grader was killed")]
    assert class_bench.not_graded(grade_class.report(grade_class.ClassRun())) == []


def test_scaling_compares_each_run_with_the_first():
    def ran(workers, wall, cpu, graded):
        return {"workers": workers, "cost": {"wall_s": wall, "cpu_s": cpu},
                "kinds": {"correct": {"graded": graded - 1}, "broken": {"graded": 1}}}
    rows = class_bench.scaling([ran(1, 600.0, 900.0, 60), ran(2, 400.0, 990.0, 60)])
    assert [(r["workers"], r["speedup"], r["cpu_ratio"], r["graded"])
            for r in rows] == [(1, 1.0, 1.0, 60), (2, 1.5, 1.1, 60)]
    shown = class_bench.scaling_table(rows).splitlines()
    assert shown[2].split() == ["2", "400", "990", "60", "1.5", "1.1"]


def test_a_worker_count_below_one_is_refused_before_any_grade(capsys):
    import argparse
    args = argparse.Namespace(cls=10, workers=[2, 0], alone=False, json=False)
    assert class_bench.main(args) == 2
    assert "--workers at least 1" in capsys.readouterr().err
