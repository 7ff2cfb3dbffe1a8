"""Step-time model for EP overlap: predicted step time with overlap off and on, before any run.

Contract
--------
Public API (stdlib only - importing this package never imports torch, megatron or numpy; inside
this project it reads ``base.sizes`` and ``base.gpus``, plain arithmetic and data):

    StepInputs, Cluster, LinkSpec                      (inputs)   what is predicted for where
    predict(inputs, cluster, calibration=None)          (model)    -> Prediction
    rank_dispatchers(inputs, cluster, calibration=None) (model)    -> [(dispatcher, Prediction | NotModelled)]
    OutsideModel                                        (model)    no prediction for these inputs, with the
                                                                   reason (predictions are finite or not made)
    Calibration, default_calibration()                  (costs)    the fitted constants (calibration.json)
    fit(rows, calibration_ids), load_rows(paths)        (calibrate) re-fit from bench results.json
    published.ROWS, published.check(rows, predicted)    (published) MB's published rows as checks (never fitted)

Pure: functions of plain values only; a Megatron-Bridge config is read by the adapter in ``core``
(``core.prediction_inputs.from_config`` -> StepInputs, ``core.prediction.for_config(cfg, target)`` ->
ConfigPrediction for a ClusterEnvironment: plan --predict, the advice rules, auto).

Method, defaults with sources, calibration and validation: docs/prediction.md.
"""

from .costs import Calibration, default_calibration
from .inputs import Cluster, LinkSpec, StepInputs
from .model import NotModelled, OutsideModel, Prediction, predict, rank_dispatchers

__all__ = [
    "StepInputs", "Cluster", "LinkSpec", "Calibration", "default_calibration",
    "Prediction", "NotModelled", "OutsideModel", "predict", "rank_dispatchers",
]
