"""The SoCs the emulated node can be: torch_npu's names and ``get_soc_version()`` codes, and their product lines.

Names and codes are torch_npu's ``c10_npu::SocVersion`` (``torch_npu/csrc/core/npu/NpuVariables.h``);
the product line of a code comes from the MC2 contract's ``[soc]`` ranges (Atlas A2: 220-225, Atlas A3:
250-256), which is what the MC2 pages' limits are written against.
"""

from __future__ import annotations

from npu_sim import contract, settings

#: SoC name -> ``torch_npu.npu.get_soc_version()`` code.
CODES = {
    "Ascend910B1": 220,
    "Ascend910B2": 221,
    "Ascend910B2C": 222,
    "Ascend910B3": 223,
    "Ascend910B4": 224,
    "Ascend910B4-1": 225,
    "Ascend910_9391": 250,
    "Ascend910_9392": 251,
    "Ascend910_9381": 252,
    "Ascend910_9382": 253,
    "Ascend910_9372": 254,
    "Ascend910_9362": 255,
    "Ascend910_9363": 256,
}


def family(code: int) -> str | None:
    """The product line ("Atlas A2", "Atlas A3") of a SoC code, or None."""
    return next((name for name, codes in contract.SOC_FAMILIES.items() if code in codes), None)


def configured() -> tuple[str, int]:
    """The node's SoC name and code, from ``NPU_SIM_SOC``."""
    name = settings.soc_name()
    if name not in CODES:
        raise settings.SettingError(f"{settings.SOC}={name!r}: one of {', '.join(CODES)}")
    return name, CODES[name]
