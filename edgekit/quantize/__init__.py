"""Quantization per target profile: from an FP32 ONNX model and a precision (or ``auto``) to a quantized model.

Where things live:

* ``stage.py`` - the quantize stage of the build (:func:`~edgekit.quantize.stage.quantize_model`,
  :func:`~edgekit.quantize.stage.search_auto_precision`): model + plan -> quantized model, calibration recorded.
* ``gating.py``, ``plan.py``, ``cpu_isa.py`` - which precisions a target supports, and the backend-neutral
  :class:`~edgekit.quantize.plan.QuantizationPlan` (what is quantized, how, what stays float and why).
* ``calibration/`` - observers, activation collection and the range cache; ``codecs/`` - exact low-precision
  codecs; ``float_writers.py``, ``block_activations.py`` - fp8 / MX / NVFP4 graphs.
* Plan refiners that keep nodes float or rewrite the float graph exactly: ``channel_spread.py``,
  ``cnn_folding.py``, ``edge_layers.py``, ``thin_convs.py``; ``node_groups.py`` and ``sensitivity.py`` rank
  node groups by what quantizing each costs.
* ``--precision auto``, backend-neutral:

  - ``candidates.py`` - candidate plans as data: name, what each quantizes (a precision per node), why;
  - ``pricing.py`` - what a candidate is expected to cost against the search's time budget;
  - ``judging.py`` - how a candidate is judged: the recipe's metric, latency timed interleaved with FP32;
  - ``auto.py`` - the search: try candidates in order, skip what cannot win, return the fastest inside budget;
  - ``runoff.py`` - the finalists (by rank) re-timed interleaved over several rounds before one is chosen.

* ``ort/`` - ONNX Runtime behind the backend boundary: the graph writers (pre-processing, static QDQ, NHWC
  layout, dynamic int8, int4, ONNX Runtime's default plan) and what ``auto`` needs from this engine (its own
  candidates, the builder, the timer and evaluators, the end-to-end planner).

A new engine (OpenVINO, TensorRT) plugs into ``auto`` as ``ort/`` does, in a package of its own: a builder
(``Candidate -> BuiltCandidate``), an evaluator and an interleaved timer, and a planner that lists
:func:`~edgekit.quantize.candidates.auto_candidates` plus its own candidates and calls
:func:`~edgekit.quantize.auto.search_auto`; the search itself is not edited.
"""
