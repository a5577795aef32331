"""OpenVINO behind the quantize package's backend boundary: what ``--precision auto`` needs to try OpenVINO beside
ONNX Runtime on a target that allows both (:mod:`.auto`: its candidates, builder, timer and evaluator)."""
