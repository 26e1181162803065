"""Dashboard 2, "spx-trainer / NVLink": link state matrix, bandwidth per GPU and per link, errors.

Bandwidth and error rates come from the recording rules in rules/spx_recording.yml (rates of the
byte and error counters over fixed windows), so a 144-link matrix stays cheap at any zoom level.
"""

from __future__ import annotations

from . import grafana as g
from .common import LINK, NVLINK_COLUMNS, TAG, UP_DOWN, link_variable, standard_variables

TX = "instance_gpu_link:spx_gpu_nvlink_transmit_bytes:rate1m"
RX = "instance_gpu_link:spx_gpu_nvlink_receive_bytes:rate1m"
ERR = "instance_gpu_link_type:spx_gpu_nvlink_errors:rate5m"
RED_IF_ANY = g.steps(("green", None), ("red", 1))


def state() -> list[g.Panel]:
    return [
        g.row("Link state"),
        g.stat("Links up", "Selected links reporting up.", [g.query(f"sum(spx_gpu_nvlink_up{{{LINK}}})")], w=4),
        g.stat("Links down", "Selected links reporting down (alert SpxNvlinkDown).",
               [g.query(f"count(spx_gpu_nvlink_up{{{LINK}}} == 0) or vector(0)")], w=4, thresholds=RED_IF_ANY),
        g.stat("Transmit", "NVLink bytes/s sent by the selected GPUs and links (1 m rate).",
               [g.query(f"sum({TX}{{{LINK}}})")], unit="Bps", w=4),
        g.stat("Receive", "NVLink bytes/s received by the selected GPUs and links (1 m rate).",
               [g.query(f"sum({RX}{{{LINK}}})")], unit="Bps", w=4),
        g.stat("Errors", "NVLink CRC, replay and recovery errors per second (5 m rate).",
               [g.query(f"sum({ERR}{{{LINK}}})")], unit="cps", w=4,
               thresholds=g.steps(("green", None), ("orange", 0.1), ("red", 1))),
        g.stat("Errors (time range)", "NVLink errors counted over the dashboard's time range.",
               [g.query(f"sum(increase(spx_gpu_nvlink_errors_total{{{LINK}}}[$__range]))")], w=4,
               decimals=0, thresholds=RED_IF_ANY),
        g.table("Link state (GPU × link)", "Every link of every selected GPU; red cells are links down.",
                [g.query(f"max by (gpu, link) (spx_gpu_nvlink_up{{{LINK}}})", table=True)],
                transformations=g.matrix("gpu", "link", NVLINK_COLUMNS), mappings=UP_DOWN,
                cell="color-background", h=9),
        g.timeseries("Links down per GPU", "Number of links down on each GPU over time.",
                     [g.query(f"sum by (gpu) (1 - spx_gpu_nvlink_up{{{LINK}}})", "GPU {{gpu}}")], min_=0, w=24, h=6),
    ]


def bandwidth() -> list[g.Panel]:
    per_link = "GPU {{gpu}} link {{link}}"
    return [
        g.row("Bandwidth"),
        g.timeseries("Transmit per GPU", "NVLink bytes/s sent, summed over the selected links.",
                     [g.query(f"sum by (gpu) ({TX}{{{LINK}}})", "GPU {{gpu}}")], unit="Bps", min_=0),
        g.timeseries("Receive per GPU", "NVLink bytes/s received, summed over the selected links.",
                     [g.query(f"sum by (gpu) ({RX}{{{LINK}}})", "GPU {{gpu}}")], unit="Bps", min_=0),
        g.timeseries("Transmit per link", "Pick one GPU to keep this readable (18 lines per GPU).",
                     [g.query(f"max by (gpu, link) ({TX}{{{LINK}}})", per_link)], unit="Bps", min_=0),
        g.timeseries("Receive per link", "Pick one GPU to keep this readable (18 lines per GPU).",
                     [g.query(f"max by (gpu, link) ({RX}{{{LINK}}})", per_link)], unit="Bps", min_=0),
        g.table("Transmit now (GPU × link)", "Current 1 m transmit rate of every link; a down or idle link "
                "shows 0.", [g.query(f"max by (gpu, link) ({TX}{{{LINK}}})", table=True)],
                transformations=g.matrix("gpu", "link", NVLINK_COLUMNS), unit="Bps", h=9, w=12),
        g.table("Receive now (GPU × link)", "Current 1 m receive rate of every link.",
                [g.query(f"max by (gpu, link) ({RX}{{{LINK}}})", table=True)],
                transformations=g.matrix("gpu", "link", NVLINK_COLUMNS), unit="Bps", h=9, w=12),
    ]


def errors() -> list[g.Panel]:
    return [
        g.row("Errors"),
        g.timeseries("Error rate by GPU and type", "crc_flit/crc_data: corrupted transfers (retried); replay: "
                     "retransmissions; recovery: the link retrained (alerts SpxNvlinkErrorRate, "
                     "SpxNvlinkRecovery).",
                     [g.query(f"sum by (gpu, type) ({ERR}{{{LINK}}})", "GPU {{gpu}} {{type}}")], unit="cps", min_=0),
        g.timeseries("Error rate per link", "All error types summed, per link.",
                     [g.query(f"sum by (gpu, link) ({ERR}{{{LINK}}})", "GPU {{gpu}} link {{link}}")],
                     unit="cps", min_=0),
        g.table("Errors in time range (GPU × link)", "Errors of all types counted over the time range.",
                [g.query(f"sum by (gpu, link) (increase(spx_gpu_nvlink_errors_total{{{LINK}}}[$__range]))",
                         table=True)],
                transformations=g.matrix("gpu", "link", NVLINK_COLUMNS), thresholds=RED_IF_ANY,
                cell="color-text", h=9, w=14),
        g.table("Errors in time range (GPU × type)", "Errors of the selected links by type.",
                [g.query(f"sum by (gpu, type) (increase(spx_gpu_nvlink_errors_total{{{LINK}}}[$__range]))",
                         table=True)],
                transformations=g.matrix("gpu", "type"), thresholds=RED_IF_ANY, cell="color-text", h=9, w=10),
    ]


def build() -> dict:
    return g.dashboard(
        "spx-nvlink", "spx-trainer / NVLink",
        "NVLink link state (GPU × link), transmit/receive bandwidth per GPU and per link, and link error "
        "rates, for one host.",
        tags=[TAG, "gpu", "nvlink"], variables=[*standard_variables(), link_variable()],
        panels=[*state(), *bandwidth(), *errors()],
        links=g.dashboard_links(TAG),
    )

