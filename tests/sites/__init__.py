"""Small Django sites that tests run under a real server (gunicorn)."""
