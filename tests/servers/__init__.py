"""The test project as real servers (gunicorn, uvicorn) serve it: see ``harness.py``."""
