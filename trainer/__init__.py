"""spx.trainer: the seed's DDP / DeepSpeed loop with exact resume, async checkpoints, SIGTERM
checkpoints and a heartbeat for the spx-trainer daemon.

`Trainer` (DDP) is importable without DeepSpeed installed; `DeepSpeedTrainer` imports DeepSpeed
only when an engine is built.
"""

from spx.trainer.checkpoint import CheckpointError
from spx.trainer.config import TrainerConfig
from spx.trainer.ddp import Trainer
from spx.trainer.hashing import state_sha256
from spx.trainer.loop import FitResult
from spx.trainer.preemption import Preempted
from spx.trainer.zero import DeepSpeedTrainer

__all__ = ["CheckpointError", "DeepSpeedTrainer", "FitResult", "Preempted", "Trainer", "TrainerConfig", "state_sha256"]
