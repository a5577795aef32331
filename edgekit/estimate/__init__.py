"""Estimates of what a model will do on a target (latency, throughput, memory, energy) from its ONNX
graph and the target's figures, and the fleet calibration of their efficiency factors. Every number
this package returns is an ESTIMATE and says which factors produced it."""

from edgekit.estimate.calibration import CalibrationEntry, Observation, default_calibration_path, load_calibration, write_calibration
from edgekit.estimate.estimate import Estimate, EstimateInput, bundle_input, estimate
from edgekit.estimate.graph_cost import EstimateError, GraphCost, NodeCost, graph_costs
from edgekit.estimate.hardware import Hardware, hardware_for
from edgekit.estimate.roofline import Factors, default_factors

__all__ = ["CalibrationEntry", "Estimate", "EstimateError", "EstimateInput", "Factors", "GraphCost", "Hardware", "NodeCost",
           "Observation", "bundle_input", "default_calibration_path", "default_factors", "estimate", "graph_costs",
           "hardware_for", "load_calibration", "write_calibration"]  # fmt: skip
