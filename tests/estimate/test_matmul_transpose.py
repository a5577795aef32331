"""A matrix product whose A operand is stored transposed reduces over A's second-to-last dim (review: FusedMatMul and
FusedGemm with transA=1 counted K from A's last dim, 64x too few ops on ONNX Runtime's Transpose+MatMul fusion)."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from edgekit.estimate.graph_cost import graph_costs

K, M, N = 1024, 16, 64
OPSET = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def _product(op: str, a_shape: list[int], b_shape: list[int], domain: str = "com.microsoft", **attrs: object) -> onnx.ModelProto:
    node = helper.make_node(op, ["a", "b"], ["y"], domain=domain, name="product", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape),
                                            helper.make_tensor_value_info("b", TensorProto.FLOAT, b_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])  # fmt: skip
    return helper.make_model(graph, opset_imports=OPSET)


@pytest.mark.parametrize("op, domain, attrs", [("FusedMatMul", "com.microsoft", {}), ("FusedGemm", "com.microsoft", {"activation": "Relu"}),
                                               ("Gemm", "", {})])  # fmt: skip
def test_trans_a_reduces_over_the_second_to_last_dim(op: str, domain: str, attrs: dict[str, object]) -> None:
    cost = graph_costs(_product(op, [K, M], [K, N], domain, transA=1, **attrs))
    (product,) = cost.nodes
    assert product.ops == 2 * M * N * K
    assert product.gemm_mnk == (M, N, K)


def test_fused_matmul_with_trans_b_and_alpha_counts_the_same_product() -> None:
    (product,) = graph_costs(_product("FusedMatMul", [K, M], [N, K], transA=1, transB=1, alpha=0.5)).nodes
    assert product.ops == 2 * M * N * K and product.gemm_mnk == (M, N, K)


def test_fused_matmul_trans_batch_a_with_trans_a_reduces_over_the_leading_dim() -> None:
    # A [5, 2, 3] used as [2, 3, 5] then transposed: [2, 5, 3] x B [2, 5, 7] -> [2, 3, 7], K = 5 (checked on ONNX Runtime)
    (product,) = graph_costs(_product("FusedMatMul", [5, 2, 3], [2, 5, 7], transA=1, transBatchA=1)).nodes
    assert product.ops == 2 * (2 * 3 * 7) * 5
    (plain,) = graph_costs(_product("FusedMatMul", [5, 2, 3], [2, 3, 7], transBatchA=1)).nodes  # A as [2, 5, 3]: K = 3
    assert plain.ops == 2 * (2 * 5 * 7) * 3
