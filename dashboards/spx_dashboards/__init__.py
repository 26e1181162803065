"""Generators of the spx-trainer Grafana dashboards; run ../build.py to write the JSON."""
