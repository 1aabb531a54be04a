"""torch_npu's MC2 contract (``mc2_contract.toml``): the kernels' exact schemas and their documented limits.

The one source of both: the emulator's kernels (:mod:`npu_sim.mc2`) define these schemas and refuse what
the limits rule out, and the coc-conformance project's tests read the same file through this module.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

#: The contract file, as shipped in the package.
PATH = resources.files("npu_sim").joinpath("mc2_contract.toml")
CONTRACT: dict[str, Any] = tomllib.loads(PATH.read_text("utf-8"))
#: Where the schemas were read from (torch_npu wheel and op-plugin commit).
SOURCE: dict[str, str] = CONTRACT["source"]
#: Kernel name -> schema line, exactly as torch_npu registers it (without the ``npu::`` namespace).
SCHEMAS: dict[str, str] = CONTRACT["schemas"]
#: Kernel name -> its CANN page's limits (``doc``, ``tp`` per product line, ``k``, ``dtypes``, ``bias``, ...).
LIMITS: dict[str, dict[str, Any]] = CONTRACT["limits"]
#: Product line -> range of ``get_soc_version()`` codes.
SOC_FAMILIES: dict[str, range] = {name: range(lo, hi + 1) for name, (lo, hi) in CONTRACT["soc"].items()}
