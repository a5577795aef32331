"""ONNX Runtime behind the quantize package's backend boundary.

Graph writers for a :class:`~edgekit.quantize.plan.QuantizationPlan`: :mod:`.graph_files` (pre-processing, saving),
:mod:`.static_plan` (what a static int8 plan quantizes on a graph), :mod:`.static_qdq` (static int8 as QDQ),
:mod:`.layout` (that graph shaped for ONNX Runtime's NHWC kernels), :mod:`.dynamic` (dynamic int8), :mod:`.int4`
(weight-only int4), :mod:`.default_plan` (ONNX Runtime's own ``quantize_static`` defaults).

What ``--precision auto`` needs from this engine: :mod:`.candidates` (its own candidates), :mod:`.builder` (writes a
candidate), :mod:`.judges` (interleaved timer and evaluators, on :mod:`.sessions`) and :mod:`.planner` (end to end).
"""
