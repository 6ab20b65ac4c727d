"""Training plugins: sparsity and communication-efficient distributed optimizers for Lightning.

Each is switched on from a training YAML (fragments in ``configs/plugins/``):

* :class:`CommDDPStrategy` (``trainer.strategy``): DDP with a named gradient hook, also on CPU:
  ``allreduce`` (counted baseline), ``topk`` (Top-k + error feedback), ``oktopk`` (Ok-Topk),
  ``powersgd`` (torch's hook), ``noop`` (for the plugins below);
* :class:`EagerSGD`, :class:`WAGMA` (``trainer.callbacks``): partial all-reduce with bounded
  staleness; group model averaging;
* :class:`LionCub` (``optimizer``): Lion with voted, quantised updates;
* :class:`MagnitudePruning`, :class:`NMSparsity` (``trainer.callbacks``): masks that persist;
* :class:`CommReport` (``trainer.callbacks``): bytes communicated per step.
"""

from postcast.models.plugins.ddp import COMMS, CommDDPStrategy
from postcast.models.plugins.eager_sgd import EagerSGD, PartialAllreduce
from postcast.models.plugins.lion import LionCub
from postcast.models.plugins.report import CommReport
from postcast.models.plugins.sparsity import MagnitudePruning, NMSparsity
from postcast.models.plugins.wagma import WAGMA, GroupAverager, butterfly_groups

__all__ = [
    "COMMS",
    "WAGMA",
    "CommDDPStrategy",
    "CommReport",
    "EagerSGD",
    "GroupAverager",
    "LionCub",
    "MagnitudePruning",
    "NMSparsity",
    "PartialAllreduce",
    "butterfly_groups",
]
