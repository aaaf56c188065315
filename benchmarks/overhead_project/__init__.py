"""The small project ``benchmarks/overhead.py`` measures: settings, the view, its URLs."""
