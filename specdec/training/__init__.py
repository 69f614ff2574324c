"""Training EAGLE-3 heads for a target (:func:`train_eagle3_head`), from scratch or warm-started.

Modules: :mod:`~specdec.training.eagle3` (the run), :mod:`~specdec.training.eagle3_data` (training
sequences, recipes), :mod:`~specdec.training.eagle3_features` (draft vocabulary, target features),
:mod:`~specdec.training.eagle3_ttt` (TTT unroll and loss), :mod:`~specdec.training.eagle3_init`
(fresh and parent heads), :mod:`~specdec.training.eagle3_checkpoint` (resumable checkpoints),
:mod:`~specdec.training.eagle3_eval` (teacher-forced agreement).
"""

from __future__ import annotations

from specdec.lazy import lazy_exports

_EXPORTS = {
    "train_eagle3_head": "specdec.training.eagle3",
    "Eagle3TrainConfig": "specdec.training.eagle3",
    "TrainedHead": "specdec.training.eagle3",
    "read_training_metadata": "specdec.training.eagle3",
    "TrainingDataError": "specdec.training.eagle3_data",
    "TrainingMemoryError": "specdec.training.eagle3_features",
    "CheckpointMismatchError": "specdec.training.eagle3_checkpoint",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
