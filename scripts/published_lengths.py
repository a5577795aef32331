"""Sequence lengths of a published BERT workload, for the rows whose harness runs each sample at its own length.

NVIDIA's MLPerf BERT engines take a batch as its samples' tokens laid end to end with their cumulative lengths
(``cu_seqlens``) and run the variable-sequence-length TensorRT plugins on them (mlcommons/inference_results_v3.0,
closed/NVIDIA/code/bert/tensorrt/fp16_builder_var_seqlen.py, commit dad59af0): no sample is padded to 384. A published row of such a run is estimated on the graph at an EFFECTIVE length taken from the
dataset's length histogram, by what the row's figure measures (:func:`effective_length`):

* a median latency (SingleStream p50): the median length (latency grows with length, so the median sample sets it);
* a throughput (Offline samples/s): the mean length (a batch's GEMM work is its total token count; attention's
  part, quadratic in length, is about L / (6 x hidden) of BERT-large's work: under 3 % at these lengths).

No factor is fitted here: the lengths are counted from a published histogram, cited below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scripts.published_graphs import PublishedFiguresError

#: SQuAD v1.1 features tokenized for BERT (WordPiece, max 384 tokens, document stride 128): how many features have
#: each length 1..384 (index 0 = 1 token; the last bin holds the features cut at 384). Copied from Graphcore's
#: histogram for "Efficient Sequence Packing without Cross-contamination" (Krell et al., arXiv 2107.02027):
#: github.com/graphcore/examples tutorials/blogs_code/packedBERT/histograms.py (``squad_1_1_histogram``), commit
#: 2d8b565326ef6ba730492ad8badd984b067645bc. Its 88,641 features are the TRAINING split; MLPerf times the 10,833
#: features of the dev split, built the same way from articles of the same kind: their distribution is assumed to
#: match (an assumption the docs state with every row that uses it).
SQUAD_V1_1_LENGTHS: tuple[int, ...] = (
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    3, 2, 0, 9, 10, 16, 22, 24, 36, 35, 46, 42, 48, 57, 86, 83, 86, 87, 86, 97, 90, 99, 85, 94, 105, 114, 110,
    93, 116, 118, 114, 116, 117, 127, 115, 155, 137, 145, 157, 151, 153, 149, 163, 157, 134, 150, 144, 132,
    166, 162, 177, 160, 149, 151, 138, 156, 148, 176, 163, 182, 188, 182, 177, 199, 182, 203, 201, 264, 250,
    244, 289, 346, 327, 298, 377, 386, 444, 431, 503, 553, 532, 570, 611, 677, 648, 673, 712, 722, 745, 692,
    697, 747, 754, 741, 777, 781, 825, 813, 836, 777, 776, 756, 789, 790, 765, 753, 729, 748, 772, 766, 760,
    741, 725, 729, 759, 732, 730, 730, 741, 705, 708, 725, 656, 688, 688, 677, 662, 628, 635, 618, 586, 527,
    562, 619, 562, 578, 538, 558, 582, 541, 575, 526, 556, 498, 529, 486, 528, 541, 482, 521, 483, 466, 514,
    459, 447, 436, 383, 401, 408, 381, 369, 364, 381, 420, 391, 388, 358, 365, 357, 358, 355, 297, 290, 267,
    308, 329, 304, 332, 289, 282, 304, 242, 263, 288, 238, 257, 271, 288, 277, 264, 253, 239, 217, 260, 214,
    247, 237, 212, 205, 193, 200, 208, 195, 193, 201, 187, 170, 176, 195, 156, 201, 179, 159, 183, 169, 178,
    163, 153, 171, 144, 138, 181, 165, 171, 161, 159, 166, 142, 138, 151, 155, 134, 141, 132, 123, 119, 109,
    125, 123, 131, 135, 115, 108, 102, 117, 105, 99, 84, 100, 85, 85, 85, 95, 122, 105, 114, 113, 100, 80,
    96, 86, 79, 80, 87, 92, 73, 73, 64, 76, 72, 77, 67, 60, 71, 77, 79, 72, 55, 67, 42, 59, 65, 72, 49, 43,
    62, 48, 50, 54, 45, 42, 53, 56, 45, 43, 32, 30, 36, 42, 37, 45, 28, 41, 31, 44, 35, 36, 47, 47, 48, 65,
    32, 23, 35, 38, 20, 23, 22, 21, 27, 20, 26, 18, 18, 22, 17, 17, 14, 26, 15, 20, 22, 19, 24, 17, 15, 20,
    20, 22, 22, 17, 20, 16, 21, 16, 23, 12, 14, 1054,
)
SQUAD_V1_1_SOURCE = ("https://github.com/graphcore/examples/blob/2d8b565326ef6ba730492ad8badd984b067645bc/"
                     "tutorials/blogs_code/packedBERT/histograms.py")
STATISTICS = ("median", "mean")


@dataclass(frozen=True)
class LengthSource:
    histogram: tuple[int, ...]  # count of samples with 1, 2, ... tokens
    url: str
    what: str


#: the ``sequence_length.lengths`` values a published row may name
LENGTHS: dict[str, LengthSource] = {
    "squad-v1.1": LengthSource(SQUAD_V1_1_LENGTHS, SQUAD_V1_1_SOURCE,
                               "SQuAD v1.1 BERT features (max 384 tokens, stride 128), Graphcore's published histogram of the "
                               "88,641 training-split features (MLPerf's 10,833 dev features assumed alike)"),
}


def effective_length(histogram: Sequence[int], statistic: str) -> int:
    """The length (tokens) a run over samples of these lengths behaves like: the ``median`` sample's, or the ``mean``
    (rounded to the nearest token)."""
    total = sum(histogram)
    if total <= 0:
        raise PublishedFiguresError("a sequence-length histogram with no samples", hint="give the count of samples per length")
    if statistic == "mean":
        return round(sum((i + 1) * n for i, n in enumerate(histogram)) / total)
    if statistic == "median":
        seen = 0
        for i, n in enumerate(histogram):
            seen += n
            if 2 * seen >= total:
                return i + 1
    raise PublishedFiguresError(f"unknown sequence-length statistic '{statistic}'", hint=f"one of {', '.join(STATISTICS)}")
