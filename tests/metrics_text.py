"""Reading a Prometheus text exposition in tests: a registry's scrape, and its samples by name."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families


def scrape(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample called `name` in a text exposition."""
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out.append((dict(sample.labels), sample.value))
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    """The one sample `name` whose labels include `labels` (None if there is none)."""
    matches = [v for lab, v in samples(text, name) if all(lab.get(k) == want for k, want in labels.items())]
    assert len(matches) <= 1, f"{name}{labels} matches {len(matches)} samples"
    return matches[0] if matches else None
