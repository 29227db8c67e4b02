"""The worker-pool model behind "Watch it": the claims the chapter makes of it."""

import statistics

import pytest

from handson.book import sim


def test_prng_matches_reference_values():
    # mulberry32(1): the first three outputs of the usual JavaScript one-liner
    # (Math.imul form), as node prints them; the browser port uses that form.
    draw = sim.mulberry32(1)
    got = [round(draw() * 4294967296) for _ in range(3)]
    assert got == [2693262067, 11749833, 2265367787]


def test_spike_of_60_at_4_workers_and_6_per_s_drains_in_about_30_s():
    predicted = sim.predicted_drain_s(60, sim.QueueSim(workers=4).capacity(), 6.0)
    assert predicted == pytest.approx(30.0)
    drains = [sim.spike_drain_s(seed) for seed in range(1, 21)]
    assert statistics.mean(drains) == pytest.approx(predicted, rel=0.2)
    assert all(10 < d < 90 for d in drains), drains


def test_more_headroom_drains_faster():
    slow = statistics.mean(sim.spike_drain_s(s, workers=4) for s in range(1, 11))
    fast = statistics.mean(sim.spike_drain_s(s, workers=6) for s in range(1, 11))
    assert fast < slow / 2


def _busy_sim(ack_before_work):
    s = sim.QueueSim(seed=7, arrivals=6, workers=4, ack_before_work=ack_before_work)
    s.run(10)
    while s.busy() == 0:
        s.step()
    return s


def test_ack_before_work_and_a_kill_loses_exactly_that_job():
    s = _busy_sim(ack_before_work=True)
    victim = s.pool[s.kill_busy()]
    assert victim.state == "dead" and victim.job is None
    s.run(20)
    assert s.lost == 1
    assert s.redelivered == 0
    assert s.orphans == []
    in_system = len(s.queue) + s.busy()
    assert s.arrived == s.done + in_system + s.lost


def test_ack_after_work_a_kill_redelivers_and_loses_nothing():
    s = _busy_sim(ack_before_work=False)
    s.kill_busy()
    assert len(s.orphans) == 1
    orphan = s.orphans[0]
    assert 0 < orphan.deadline - s.tick <= sim.LEASE_TICKS
    s.run(sim.LEASE_TICKS * sim.TICK_S + 0.1)
    assert s.redelivered == 1 and s.lost == 0 and s.orphans == []
    assert orphan.retry
    for _ in range(5):
        s.kill_busy()
        s.run(5)
    assert s.lost == 0 and s.redelivered == 6
    assert s.arrived == s.done + len(s.queue) + s.busy() + len(s.orphans)


def test_retry_returns_to_the_head_of_the_queue():
    s = sim.QueueSim(seed=2, arrivals=0, workers=1)
    s.spike(10)
    s.step()
    s.kill_busy()
    killed = s.orphans[0]
    while s.orphans:
        s.step()
    assert s.queue[0] is killed and killed.retry


def test_shrinking_the_pool_lets_busy_workers_finish():
    s = sim.QueueSim(seed=4, arrivals=0, workers=4)
    s.spike(8)
    s.step()
    s.set_workers(1)
    s.run(10)
    assert s.done == 8 and s.lost == 0 and len(s.pool) == 1


def test_scenario_events_are_applied_and_unknown_ones_rejected():
    trace = sim.run_scenario({"seed": 5, "arrivals": 6, "workers": 4, "ticks": 50,
                              "events": [[10, "spike", 60]]})
    assert trace[9][1] - trace[8][1] > 40
    with pytest.raises(ValueError, match="unknown scenario action"):
        sim.run_scenario({"seed": 5, "arrivals": 6, "workers": 4, "ticks": 2,
                          "events": [[1, "explode"]]})
