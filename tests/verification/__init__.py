"""The checker of issue 51: generated histories under a nemesis, checked against the contract.

``run.py`` starts private servers (a database or a Redis server, gunicorn workers serving
:mod:`.views`), runs a workload and a nemesis generated from one seed, records every request,
answer, fault and effect, and checks the whole history (:mod:`.checker`). ``--plant`` breaks the
app on purpose inside the servers' own processes (:mod:`.plants`): the checker must find it.
"""
