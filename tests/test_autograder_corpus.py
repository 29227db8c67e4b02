"""Wrong submissions lose points on the check that names their bug, and only there.

The notebooks here (tests/corpus/submissions/bugs.py) edit the solution
notebooks one bug at a time, for what only a whole notebook shows: a broken
notebook (an endless loop, sys.exit(), a syntax error, a process left running,
an edited test cell: restored, a note, not a zero), and the queue bugs whose
chaos run must name them again (an ack without the attempt check, a claim in
two round trips, a reap that is not atomic). Correct submissions written
differently score full marks: a queue with other keys reaping in batches,
another dedup key, an outbox relay publishing with idempotent ids in batches.
The corpus's notebooks of the other assignments, and its queue on Redis
Streams, are graded by the class test (`IN_CLASS`), against the same entries.
A bug in one function is graded by `python -m autograder corpus`
(tests/corpus/, a folder per assignment), which grades each module as its
assignment's judge does, without running a notebook around it.

Each submission is graded once and in full (module fixture): assignment 2's
bugs are named by contract checks, and the chaos run's built faults (a zombie
acking past its job's next claim, racing reapers) name them again, which a
quick check would not show (it stops the chaos run at the first failed
contract check).
"""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
from test_autograder import load_path

from autograder.grade import grade
from autograder.judges import checks
from autograder.notebooks import feedback, notebook
from handson.queues import cost

# Grading the whole corpus once (the module fixture) takes minutes.
pytestmark = pytest.mark.timeout(1800)

corpus = load_path("bugs", notebook.REPO / "tests" / "corpus" / "submissions"
                   / "bugs.py")
WRONG = sorted(set(corpus.SUBMISSIONS) - corpus.IN_CLASS)
CORRECT = sorted(set(corpus.CORRECT) - corpus.IN_CLASS)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade every submission once, two at a time (each has its own Redis).

    Most of a grading run is waiting on leases and sleeps, so two in parallel
    take little more wall time than one.
    """
    tmp = tmp_path_factory.mktemp("corpus")

    def one(name):
        path = corpus.build(name, tmp, notebook.SOURCE_DIR)
        start = time.monotonic()
        return name, (grade(path), time.monotonic() - start)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, WRONG + CORRECT))


@pytest.mark.parametrize("name", WRONG)
def test_bug_costs_the_check_that_names_it(graded, name):
    result, elapsed = graded[name]
    missed = corpus.missed(name, json.loads(result.to_json()))
    assert not missed, "\n".join(missed)
    assert 0 <= result.score < result.max_score
    # a hang, not a slow machine: a loaded suite has taken 180 s
    assert elapsed < 400, f"grading {name} took {elapsed:.0f} s"


def test_nothing_the_submissions_started_is_left_running(graded):
    left = [p for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [])[:2] == ["sleep", corpus.SLEEPER]]
    assert not left, left


@pytest.mark.parametrize("name", CORRECT)
def test_correct_queue_written_differently_scores_full_marks(graded, name):
    result, _ = graded[name]
    failed = [o.explain() for o in result.outcomes if not o.ok]
    assert not failed, "\n".join(failed)
    assert result.score == result.max_score


def test_failed_chaos_checks_are_drawn_on_the_feedback_page(graded):
    """Every failed chaos check with witnesses gets one picture per witness job,
    on a page that needs nothing from the network."""
    drawn = 0
    for name in WRONG:
        result, _ = graded[name]
        html = feedback.page(result)
        assert "src=" not in html and "href=" not in html
        for o in result.outcomes:
            if o.ok or not o.witnesses or not o.name.startswith("chaos_"):
                continue
            assert len(o.timelines) == len(o.witnesses), o.name
            for tl, witness in zip(o.timelines, o.witnesses, strict=True):
                assert witness.lstrip().startswith(tl["job"])
                assert f'data-job="{tl["job"]}"' in html
                drawn += 1
    assert drawn >= 1, "no wrong queue failed a chaos check with a witness"


def test_a_graded_queue_shows_its_cost_beside_the_reference(graded):
    """Each assignment-2 queue that ran is measured with the reference queue in
    the same run, by the server's own counters; the report and the page show
    both, and the advice names the call that costs more round trips."""
    correct = [n for n in CORRECT if n.startswith("a2_")]
    assert correct
    for name in [*correct, "a2_claim_two_trips"]:
        result, _ = graded[name]
        c = result.efficiency
        assert c, f"{name}: no cost measured ({result.problems})"
        assert c["reference"]["per_job"]["round_trips"] == len(cost.PER_JOB)
        assert checks.cost_line(c) in result.text()
        html = feedback.page(result)
        assert 'class="eo-cost-bars"' in html
        assert ("correct first" in html) == (result.score < result.max_score)
    two = graded["a2_claim_two_trips"][0].efficiency
    assert two["yours"]["claim"]["round_trips"] > two["reference"]["claim"][
        "round_trips"]
    assert cost.advice(two).startswith("claim makes")


def test_failed_schedules_are_drawn_on_the_feedback_page(graded):
    """A contract check that failed on a schedule (a call stopped or killed
    between its round trips) has that schedule drawn, with its words."""
    drawn = 0
    for name in WRONG:
        result, _ = graded[name]
        html = feedback.page(result)
        for o in result.outcomes:
            if o.ok or o.name not in ("interleavings", "killed_between_replies"):
                continue
            if "after Redis reply" not in o.got:
                continue          # not a schedule (e.g. a call that hid its replies)
            [tl] = o.timelines
            assert tl["invariant"] == o.name and tl["sentence"] == o.got
            assert f'data-job="{tl["job"]}"' in html
            drawn += 1
    assert drawn >= 1, "no wrong queue failed on a drawn schedule"
