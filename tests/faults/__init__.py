"""The fault suite (issue 25): database servers of its own, restarted, stopped, cut off and made
read-only under real app processes. Run by ``.ci/leg-faults``; selected with
``IDEMPOTENCY_FAULTS=1``."""
