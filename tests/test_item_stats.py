"""Item statistics on ledger results: pass rates, pairs failed together,
the score histogram (no grading: results as the ledger records them)."""

from test_export import result_for

from autograder.classroom import grade_class, item_stats

FAILS = [("zombie_ack_refused", "chaos_no_stale_ack"),
         ("zombie_ack_refused", "chaos_no_stale_ack", "bound_refuses"),
         ("bound_refuses",), ()]


def test_pass_rates_pairs_and_histogram(tmp_path):
    results = [result_for("claim_ack_reap", f) for f in FAILS]
    results.append(result_for("delivery_semantics", ()))
    [ds, st] = item_stats.write(tmp_path / "item-stats.md", results)
    assert (ds.name, ds.n, st.name, st.n) == ("claim_ack_reap", 4,
                                               "delivery_semantics", 1)
    assert ds.pass_rate("zombie_ack_refused") == 0.5
    assert ds.pass_rate("bound_refuses") == 0.5 and ds.pass_rate("attempt_grows") == 1
    assert ds.pairs.most_common(1) == [(("chaos_no_stale_ack", "zombie_ack_refused"),
                                        2)]
    assert sum(ds.scores.values()) == 4 and ds.scores[ds.max_score] == 1
    md = (tmp_path / "item-stats.md").read_text()
    assert "| zombie_ack_refused | 2/4 | 50% |" in md
    assert "chaos_no_stale_ack + zombie_ack_refused (2)" in md
    assert f"{ds.max_score:>4}/{ds.max_score:<4} " in md
    run = grade_class.ClassRun()
    assert "item statistics" not in grade_class.report(run)
