"""The NVML field ids the collector reads, and how one `nvmlDeviceGetFieldValues` request is laid out.

All NVLink counters of a GPU, for every link, plus the device counters that have field ids (energy,
power, ECC, remapped rows, memory temperature, PCIe byte counters), go in ONE field-values call per
GPU: `(field id, scopeId)` pairs where scopeId is the link for link fields and 0 (= GPU / power scope
GPU) for device fields. The cost is one driver round trip per GPU however many links it has.

Link fields (scopeId = link):
  NVML_FI_DEV_NVLINK_GET_STATE (165)              NVML_NVLINK_STATE_* (0 inactive, 1 active, 2 sleep)
  NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX (138/139) data payload counters, KiB
  NVML_FI_DEV_NVLINK_ERROR_DL_CRC (163)           flit CRC errors       -> type="crc_flit"
  NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY (161)        replay errors         -> type="replay"
  NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY (162)      recovery errors       -> type="recovery"
Older drivers/GPUs (≤ 12 links) expose the same counters only as one field id per link,
NVML_FI_DEV_NVLINK_{CRC_FLIT,CRC_DATA,REPLAY,RECOVERY}_ERROR_COUNT_L0..L11; those ids ride in the
same call for links 0-11 and fill in where the scoped field is unsupported (crc_data exists only
there: Hopper reports no data-CRC counter).
"""

from __future__ import annotations

from dataclasses import dataclass

import pynvml

LINK_STATE = pynvml.NVML_FI_DEV_NVLINK_GET_STATE
LINK_TX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
LINK_RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
LINK_ERRORS = {
    "crc_flit": pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
    "replay": pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    "recovery": pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
}
LINK_SCOPED = (LINK_STATE, LINK_TX, LINK_RX, *LINK_ERRORS.values())

LEGACY_MAX_LINKS = 12


def _legacy_ids(prefix: str) -> list[int]:
    return [getattr(pynvml, f"NVML_FI_DEV_NVLINK_{prefix}_ERROR_COUNT_L{i}") for i in range(LEGACY_MAX_LINKS)]


# type -> [field id of link 0, link 1, ... link 11]
LEGACY_LINK_ERRORS = {
    "crc_flit": _legacy_ids("CRC_FLIT"),
    "crc_data": _legacy_ids("CRC_DATA"),
    "replay": _legacy_ids("REPLAY"),
    "recovery": _legacy_ids("RECOVERY"),
}

# Device-scope fields: exported name -> field id (scopeId 0).
ENERGY_MJ = pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
POWER_MW = pynvml.NVML_FI_DEV_POWER_INSTANT
POWER_LIMIT_MW = pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT
ECC_CORRECTED = pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL
ECC_UNCORRECTED = pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL
REMAPPED = {
    "correctable": pynvml.NVML_FI_DEV_REMAPPED_COR,
    "uncorrectable": pynvml.NVML_FI_DEV_REMAPPED_UNC,
    "pending": pynvml.NVML_FI_DEV_REMAPPED_PENDING,
    "failure": pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
}
MEMORY_TEMP = pynvml.NVML_FI_DEV_MEMORY_TEMP
PCIE_TX_BYTES = pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES
PCIE_RX_BYTES = pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES
LINK_COUNT = pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT

DEVICE_FIELDS = (
    ENERGY_MJ, POWER_MW, POWER_LIMIT_MW, ECC_CORRECTED, ECC_UNCORRECTED, *REMAPPED.values(),
    MEMORY_TEMP, PCIE_TX_BYTES, PCIE_RX_BYTES,
)

# A field the driver does not know or the GPU does not have: an absent sample, not an error.
ABSENT_CODES = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT, pynvml.NVML_ERROR_NO_DATA)


# A field the driver or GPU will never have: asked once, then left out of the request for good.
NEVER_CODES = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)

# c_nvmlValue_t member that holds each valueType.
_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def field_value(fv: object) -> float:
    """The value of one `c_nvmlFieldValue_t`, whatever its valueType."""
    return float(getattr(fv.value, _VALUE_MEMBER.get(fv.valueType, "ullVal")))  # type: ignore[attr-defined]


@dataclass(frozen=True)
class FieldRequest:
    """The (field id, scope) list for one GPU with `links` NVLink links, built once per GPU and
    narrowed to what the GPU answers (`without`) after its first scrape."""

    links: int
    ids: tuple[tuple[int, int], ...]

    @classmethod
    def for_links(cls, links: int) -> FieldRequest:
        ids: list[tuple[int, int]] = [(fid, 0) for fid in DEVICE_FIELDS]
        for link in range(links):
            ids.extend((fid, link) for fid in LINK_SCOPED)
        for per_link in LEGACY_LINK_ERRORS.values():
            ids.extend((per_link[link], 0) for link in range(min(links, LEGACY_MAX_LINKS)))
        return cls(links, tuple(ids))

    def without(self, never: set[tuple[int, int]]) -> FieldRequest:
        return FieldRequest(self.links, tuple(i for i in self.ids if i not in never))
