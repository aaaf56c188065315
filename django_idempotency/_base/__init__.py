"""The ground floor: what every layer stands on.

Owns the app's exceptions and signals, the record's rules (each condition as SQL, a ``Q`` and in
Python), durations, the key header's parser and its formats, and the JSON encoder made once.
Imports nothing of the package: Django and the standard library only.
"""
