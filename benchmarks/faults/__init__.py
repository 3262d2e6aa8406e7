"""Fault injection: the campaign (:mod:`benchmarks.faults.campaign`) and the injectors it shares with the tests
(:mod:`benchmarks.faults.inject`)."""
