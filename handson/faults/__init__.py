"""Fault injection: the chaos engine behind `handson.chaos`, and the Redis kill."""
