"""The delivery_semantics judge: what its redelivery stream, its fresh worker
and its repeated calls must and must not claim (the wrong modules are in
tests/corpus/delivery)."""

import shutil
from pathlib import Path

from autograder.judges import delivery_observe as observing
from autograder.judges import delivery_semantics as ds
from handson import c01_job_scheduler as c01

CORPUS = Path(__file__).parent / "corpus" / "delivery"
BY = {c.name: c for c in ds.CHECKS}


def test_a_worker_slow_to_start_costs_no_check(tmp_path):
    """Cells slower to load than a call's limit (a notebook's demo cells on a
    loaded machine): the fresh worker loads before its calls are timed."""
    shutil.copy(CORPUS / "correct.py", tmp_path / "correct.py")
    slow = tmp_path / "slow_start.py"
    slow.write_text(
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "sys.path.insert(0, str(Path(__file__).parent))\n"
        "from correct import *\n"
        "_mark = Path(os.environ['TMPDIR']) / 'loaded-once'\n"
        "if _mark.exists():       # every worker after the first is slow\n"
        f"    time.sleep({observing.CALL_LIMIT_S + 2})\n"
        "_mark.touch()\n")
    ev = ds.evaluate_file(str(slow), None, quick=False)
    lost = {o.name: o.message for o in ev.outcomes if not o.ok}
    assert not lost and not ev.problems, (lost, ev.problems)


def test_the_short_stream_agrees_with_the_pages_broker():
    """The page's own dispatch, acked first, keeps the short stream's claim."""
    jobs = observing.redeliveries()
    sink, _ = c01.dispatch(jobs, ack_first=True)
    got = {str(j): sink.applied.get(j, 0) for j, _ in jobs}
    assert ds._short_want("ack_before_work", jobs) == got


def _keys_obs():
    pairs = {str(j): {"same": True, "a1": repr(j), "a2": repr(j)}
             for j in observing.KEY_JOBS}
    return {"dedup_key": {"pairs": pairs, "distinct": True}}


def test_a_missing_fresh_worker_fails_the_key_check():
    out = ds._keys(BY["dedup_key_stable"], _keys_obs())
    assert not out.ok and "fresh worker" in out.message
    one = {**_keys_obs(), "dedup_key:fresh": {"one_process": True}}
    assert ds._keys(BY["dedup_key_stable"], one).ok


def test_the_fresh_worker_meets_another_job_first_and_goes_backwards():
    order = observing.fresh_order()
    streams = {j for j, _ in observing.redeliveries()} | set(observing.KEY_JOBS)
    assert order[0] not in streams
    assert order[0] >= c01.N
    assert order[1:] == list(reversed(observing.KEY_JOBS))


def test_a_failed_repeat_call_says_it_was_the_repeat():
    key = "window:1000:2000"
    obs = {key: {"value": 195},
           f"{key}:again": {"error": "window_escapes() did not return"}}
    out = ds._repeated(BY["window_escapes"], obs, key, "window_escapes(1000)")
    assert not out.ok
    assert "called again" in out.message and "returned 195" in out.message


def test_the_reference_reads_only_its_own_thread_s_prints(monkeypatch):
    """Other threads print while the page's numbers are computed (the corpus
    command grades in threads): each of their lines still reaches stdout."""
    import io
    import sys
    import threading

    seen = io.StringIO()
    monkeypatch.setattr(sys, "stdout", seen)
    ds._reference.cache_clear()
    done, said = threading.Event(), []

    def chatter():
        while not done.wait(0.001):
            said.append(f"line {len(said)}")
            print(said[-1])
    t = threading.Thread(target=chatter)
    t.start()
    try:
        ref = ds.reference()
    finally:
        done.set()
        t.join()
    assert said and seen.getvalue().splitlines() == said
    assert set(ref["rows"]) == set(ds.ROWS)
    assert set(ref["windows"]) == set(observing.WINDOWS)
