"""Ascend MindSpeed's CoC (``mindspeed/core/tensor_parallel/coc_feature``) behind the plug-in protocol, on CPU.

``--coc-impl conformance.adapters.mindspeed:MindSpeedCoC`` with ``MINDSPEED_SRC``
naming a MindSpeed checkout of any branch with the feature-manager CoC
(``2.1.0_core_r0.12.1`` to ``core_r0.18.0`` and ``master``), on the
megatron-core that branch targets.  Nothing of MindSpeed is copied here: the
checkout goes on ``sys.path`` and MindSpeed's own code runs, defects included,
so the suite judges MindSpeed and not this package (:class:`MindSpeedCoCCompat`
opts into one fix, for comparison).

* :mod:`.checkout` -- where the checkout is, its branch and commit;
* :mod:`.loading` -- importing what the branch has, naming what it lacks;
* :mod:`.shims` -- stand-ins for the NPU stack, installed only when MindSpeed is loaded;
* :mod:`.configuration` -- ``configure``: MindSpeed's parser and the validators that police CoC, discovered;
* :mod:`.layer_patch` -- ``patch_megatron``: megatron's layers running MindSpeed's forward, with the
  arguments this branch's layer ``__init__`` takes;
* :mod:`.provenance` -- which shipped expectations fit, and a note when the commit is not theirs;
* :mod:`.implementation`, :mod:`.compat` -- the two implementations.

Only the scripted path runs: the fused path is ATB/LCAL kernels
(``mindspeed/ops/lcal_functional.py``), and the four fused ops have no
implementation outside them, so they are absent here (their cases skip), as
is every case that reaches a native kernel (:class:`NativeKernelsUnavailable`).

MindSpeed keeps its settings in process globals (``min_comm_config``,
``_COC_CFGS``): use the suite's default ``process`` launcher, not ``threaded``.
"""

from conformance.adapters.mindspeed.checkout import CHECKOUT_ENV, checkout
from conformance.adapters.mindspeed.compat import MindSpeedCoCCompat
from conformance.adapters.mindspeed.implementation import ExpectationsMismatchWarning, MindSpeedCoC
from conformance.adapters.mindspeed.loading import STAND_IN_ENV, load_mindspeed
from conformance.adapters.mindspeed.shims import GLOBAL_ARGS, NativeKernelsUnavailable, install_cpu_shims

__all__ = ["CHECKOUT_ENV", "GLOBAL_ARGS", "STAND_IN_ENV", "ExpectationsMismatchWarning", "MindSpeedCoC",
           "MindSpeedCoCCompat", "NativeKernelsUnavailable", "checkout", "install_cpu_shims", "load_mindspeed"]
