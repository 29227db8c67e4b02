"""Each Measure command at its small size: the outcome the chapter relies on."""

import pytest

from handson import measure


def test_chaos_table_four_ways(redis_url, capsys, tmp_path):
    rows = measure.chaos("small", out=str(tmp_path), url=redis_url)
    printed = capsys.readouterr().out
    assert [(x.idem, x.ack_delay) for x in rows] == [(0, 0.0), (0, 0.01),
                                                     (1, 0.0), (1, 0.01)]
    docs = measure.SIZES["small"]["chaos"]["docs"]
    for x in rows:
        assert x.lost == 0, x
        if x.ack_delay:           # a run long enough for the schedule to kill
            assert x.kills > 0, x
        assert x.distinct + x.dlq == docs, x
        # every duplicate needs a commit whose ack never landed
        assert x.duplicates <= x.in_window + x.refused, x
        if x.idem:
            assert x.rows == x.distinct == x.counter, x
            assert x.verdict == "valid", x
        else:
            assert x.counter == x.rows, x
    assert "IDEM ACK_DELAY kills in window" in printed
    assert (tmp_path / "chaos.png").stat().st_size > 0


def test_throughput_knee_and_littles_law(redis_url, capsys, tmp_path):
    t = measure.throughput("small", out=str(tmp_path), url=redis_url)
    printed = capsys.readouterr().out
    assert sorted(t.rates) == list(measure.SIZES["small"]["throughput"]["workers"])
    assert all(rate > 0 for rate in t.rates.values())
    ll = t.littles_law()
    assert ll["hours"] == pytest.approx(5_000_000 / t.best[1] / 3600)
    assert ll["workers"] * ll["per_worker"] >= ll["needed_rate"]
    assert f"os.cpu_count() = {t.cpu_count}" in printed
    assert "Little's Law: 5,000,000 docs" in printed
    assert (tmp_path / "throughput.png").stat().st_size > 0


def test_chaos_check_wants_the_naive_sink_to_duplicate():
    """A naive sink whose killed commits never come back twice fails the check."""
    row = measure.ChaosRow(0, 0.01, kills=40, in_window=4, refused=0, rows=202,
                           distinct=199, counter=202, dlq=1, lost=0, verdict="ok")
    measure.check_chaos([row])     # one of the four may be a dead job's
    for dupes in (0, 2):
        with pytest.raises(AssertionError, match="naive sink writes"):
            measure.check_chaos([measure.ChaosRow(0, 0.01, 40, 4, 0, 199 + dupes,
                                                  199, 199 + dupes, 1, 0, "valid")])


def test_knee_is_where_more_workers_stop_helping():
    t = measure.Throughput(1, 1, 2, {1: 100.0, 2: 190.0, 4: 200.0, 8: 195.0})
    assert t.knee == 2 and t.bent
    assert t.best == (4, 200.0)
    straight = measure.Throughput(1, 1, 2, {1: 100.0, 2: 190.0, 4: 360.0})
    assert straight.knee == 4 and not straight.bent     # no bend is not a knee


def test_the_sentence_past_the_knee_is_chosen_by_the_rates():
    def said(rates):
        return measure.Throughput(1, 1, 2, rates).after_knee
    assert "only took turns" in said({1: 100.0, 2: 190.0, 4: 200.0, 24: 185.0})
    assert "cost more" in said({1: 100.0, 2: 190.0, 4: 200.0, 24: 120.0})
    assert "kept climbing" in said({1: 100.0, 2: 190.0, 4: 200.0, 24: 260.0})
    none = said({1: 97.0, 2: 184.0, 4: 255.0})
    assert none.startswith("no knee up to 4 workers") and "took turns" not in none


def test_lag_drains_at_capacity_minus_arrivals(redis_url, capsys, tmp_path):
    x = measure.lag("small", out=str(tmp_path), url=redis_url)
    printed = capsys.readouterr().out
    peak = max(n for _, n, _ in x.samples)
    assert peak >= 0.5 * x.burst          # the burst shows up as a jump
    assert x.samples[-1][1] < 0.2 * peak  # ... and drains away
    assert x.slope < 0
    assert "measured drain slope" in printed
    assert (tmp_path / "lag.png").stat().st_size > 0


def test_the_lag_prose_says_when_the_producer_stopped():
    """The chapter says the producer keeps adding only in a build where it did;
    one that stopped it (the backlog not drained in time) is told so."""
    samples = [(0.0, 0, 0.0), (1.0, 100, 0.5), (2.0, 0, 0.0)]
    ran = measure.Lag(2, 100.0, 40.0, 100, 0.5, samples, -60.0)
    stopped = measure.Lag(2, 100.0, 40.0, 100, 0.5, samples, -90.0, 12.3)
    assert ran.producer == "while the producer keeps adding"
    assert "producer stopped" not in measure.lag_text(ran)
    assert "until it stopped at 12 s in this build" in stopped.producer
    assert "the producer stopped at t=12.3 s" in measure.lag_text(stopped)


def test_drain_slope_fits_the_straight_part():
    samples = [(t, 0 if t < 2 else max(0, 1000 - 100 * (t - 2)), 0.0)
               for t in range(20)]
    assert measure.drain_slope(samples, 2) == pytest.approx(-100)


def test_watch_asks_redis_cli_once_a_second(redis_url):
    lines = measure.watch(seconds=2, docs=40, url=redis_url)
    assert len(lines) == 3 and all("used_memory_human" in x for x in lines)
    first, last = (int(x.split("LLEN")[1].split()[0]) for x in (lines[0], lines[-1]))
    assert first >= last


def test_the_review_wants_the_naive_sink_to_double_its_killed_commits():
    from handson.book import review

    shown = {"naive": {"kills": 10, "duplicates": 7, "lost": 0, "in_window": 8,
                       "dlq": 1},
             "idem": {"kills": 10, "duplicates": 0, "lost": 0}}
    review.check_chaos(shown)       # a kill after the ack landed brings none back
    for bad in ({"naive": {**shown["naive"], "duplicates": 0}},
                {"naive": {**shown["naive"], "duplicates": 6}},
                {"naive": {**shown["naive"], "kills": 2}},
                {"idem": {**shown["idem"], "duplicates": 1}}):
        with pytest.raises(AssertionError):
            review.check_chaos({**shown, **bad})
