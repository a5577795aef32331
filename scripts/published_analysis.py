"""What the latest run of scripts/estimate_published.py shows, the analysis it writes under the published-figures
table of docs/estimates.md (kept apart so the script stays small; keep it true to the numbers of the table)."""

#: What the latest run shows, written after reading its table (keep it true to the numbers above it).
ANALYSIS = """### Where the estimate is off, and why

Read from the table above; nothing here is fitted to these figures, and nothing anywhere is fitted per row. Issue
31's targets (median <= 25 %, >= 70 % of rows within 35 %, nothing past 2x unexplained) are checked on both lines
above: the default factors and the leave-one-source-out validation, in which a fold fits the five numbers on the
other sources only, with a pull toward the priors whose strength a nested leave-one-source-out on those sources
chooses (point 3). On the 68 rows: default median 20 %, 54 of 68 (79 %) within 35 %; leave-one-source-out median
23 %, 49 of 68 (72 %); both meet the targets, and the two rows past 2x on both lines (YOLO11n INT8) are explained in
point 4. Four folds kept the priors; the fold leaving out Ultralytics, fitted on the MLPerf and trtexec rows, took
FP16 / FP32 efficiency to x0.63, which moved the Ultralytics rows away (that is the gap between the two lines). Caveats: the priors, the layer model
and the changes of point 1 were made by people who had read the rows then present, though no number was fitted to
them; the RetinaNet rows, each added after those changes and scored as it came (the first four +17 to +22 %, the
eight of point 1's last bullet -27 to +39 %), are the cleanest held-out check here.

1. **What changed on 2026-11-28** (the run before, 56 rows: default median 38 %, 26 of 56 within 35 %, 10 rows off
   by 2x or more; leave-one-source-out 40 %, 25 of 56, 20 rows):
   * *Orin NX: the GPU alone.* `jetson-orin-nx-16gb` quoted only GPU + 2 DLA totals (100 sparse INT8 TOPS), so a
     GPU-only engine was timed at the DLAs' share too. The profile now has the GPU's own 60 sparse TOPS (the 100 less
     the DLAs' 40: NVIDIA's DLA-SW README puts the Orin NX 16GB's DLA maximum at the AGX Orin 64GB's 15W figure;
     the AGX GPU's 170 TOPS x 32/64 tensor cores x 918/1300 MHz gives the same 60) and `gpu.max_clock_mhz: 918`
     (FP32 = 1024 cores x 2 x 918 MHz), each a labelled derivation in the target file. The 15 Ultralytics Orin NX rows
     went from -32 to -65 % to -58 to +4 % (FP16 / FP32: -41 to +4 %), now within a few points of the same models on
     the Orin Nano Super (the same GPU at 1020 MHz); the NX ResNet-50 SingleStream rows went from +2 / +3 % to
     +21 / +22 %.
   * *BERT at the length the harness runs.* NVIDIA's BERT engines take each batch as its samples' tokens end to end
     with their cumulative lengths (`cu_seqlens`, variable-length plugins: no padding to 384). A row is now estimated
     at an effective length from a published SQuAD v1.1 length histogram (`scripts/published_lengths.py`): a
     SingleStream median latency at the median length (159 tokens; latency grows with length, as the logs' min / max
     of 3.2 / 6.5 ms show), an Offline throughput at the mean length (172 tokens: GEMM work is the token count;
     attention's quadratic part is under 3 % of BERT-large's work there). The histogram is Graphcore's, of the 88,641
     TRAINING-split features (max 384 tokens, stride 128); MLPerf times the 10,833 dev features built the same way,
     assumed alike (not checked here). BERT SingleStream went from +39 to +118 % to -28 to +9 %, Offline from -42 to
     -64 % to -15 to +40 %.
   * *The validation.* The leave-one-source-out prediction of a GPU + DLA Offline row left out the DLAs' share the
     default estimate adds (those rows read -41 to -52 %): fixed. The fit now scales FP16 / FP32 and INT8 efficiency
     separately (they were multiplied, so a training set of INT8 rows left the FP16 scale to the grid's first point),
     weighs every source the same (30 Ultralytics rows outvoted 3 to 12 of each other source), keeps the prior for
     a number its rows do not constrain, and may pull toward the priors with a strength chosen by a nested
     leave-one-source-out. Without that pull the validation read 29 % (36 of 56 within 35 %) on the 56 rows and 36 %
     (30 of 60) once the RetinaNet rows were added, the folds swinging with them: see point 3.
   * *RetinaNet rows.* MLPerf v3.1's NVIDIA RetinaNet SingleStream and MultiStream latencies on the AGX Orin and the
     Orin NX (GPU only; the Offline rows ran on the GPU and both DLAs at a batch not read, and are not added), on a
     hand-written RetinaNet (ResNeXt-50 32x4d FPN, 264 classes, no NMS in the graph): +17 to +22 %.
   * *Eight more RetinaNet rows* (later the same day, 68 rows), scored as they came: MLPerf v3.0's NVIDIA
     SingleStream and MultiStream on both modules (-3 to +1 %: v3.0's engines ran 1.19-1.20x slower than v3.1's, so
     the same estimate sits between the two rounds), and the Offline rows of both rounds (GPU at the v3.0 config's
     batch 4 / 1 plus both DLAs at batch 1: v3.0 +39 % (AGX Orin) and +35 % (Orin NX), v3.1 -13 % and -27 %). The
     two rounds' Offline figures on the same modules differ 1.61x (AGX) and 1.84x (NX) while their SingleStream
     differs 1.2x: v3.1 changed its Offline engine or batches in a way the files read do not show (its config is
     not in the stored copy), and one estimate cannot follow both.
2. **What Ultralytics times.** Its `yolo benchmark` "inference" is the validator's `model(batch["img"])` (the
   AutoBackend call: binding the input, running the TensorRT engine, collecting the outputs) inside its `Profile`;
   pre-processing and NMS are timed apart (`dt[0]`, `dt[3]` in ultralytics/engine/validator.py). So these rows hold a
   Python call per image on top of the engine, at batch 1 and 640x640. They are kept with that condition; the fit's
   per-call cost is what could absorb it, and a fold can only learn it from the other sources.
3. **Why fitting does not transfer between sources: they disagree per layer.** At batch 1 NVIDIA's MLPerf harness runs
   ResNet-50 (56 layers, INT8) in 0.63 ms; the default estimate is 0.89 ms, of which 0.28 ms is 56 launches at 5 us,
   so these rows want almost no cost per layer. The estimate is 32 to 48 % under trtexec's GPU compute time of
   YOLOv8n (100 layers, no Python, no copies) and 38 to 45 % under Ultralytics' YOLO11n (FP16 / FP32): these small
   models of 16-64-channel layers at 640x640 want 14 to 29 us more a layer. One launch cost cannot serve both: fitted
   without the pull (56 rows), the folds picked 5-12 us and memory at 0.9-1 of the bandwidth, which put the left-out
   MLPerf ResNet-50 SingleStream rows at +31 to +98 %, and took FP16 / FP32 efficiency down to x0.63-0.79 for the
   small YOLO rows, which put the left-out large YOLO11 FP16 / FP32 rows at +27 to +59 % where the priors give -13 to
   +4 %. The nested choice sees the same thing on the training sources and keeps the priors. The model has no term for what
   makes small layers slow on these GPUs (a per-layer floor, occupancy of small tiles); fitting one to these rows
   would be fitting to the harness, so it is left as the open item.
4. **INT8 where TensorRT keeps layers in FP16** (the two rows past 2x with default factors, YOLO11n INT8 on the Orin
   Nano Super -56 % and the Orin NX -58 %). Ultralytics' INT8 engines of YOLO11n are only 1.26x (Nano Super) and
   1.11x (NX) faster than its FP16 ones (3.91 against 4.91 ms; 4.37 against 4.85 ms), hokwangchoi's YOLOv8n INT8
   1.27x, and the Ultralytics INT8 mAP of 0.32-0.49 shows a poor calibration: TensorRT runs a layer in INT8 only
   where that is faster and its scales allow, and these small layers mostly stay FP16, while the estimate times every
   conv at the INT8 rate (twice FP16). The calibrated, INT8-end-to-end MLPerf engines are within -28 to +41 %.
5. **The rows still past 35 % with default factors**: NVIDIA's ResNet-50 SingleStream on the AGX Orin (+40, +41 %:
   point 3), the v3.0 Orin NX BERT Offline (+40 %: 164 /s against v3.1's 195 /s on the same module and harness), the
   v3.0 AGX Orin RetinaNet Offline (+39 %: point 1's last bullet), and ten small-YOLO rows (YOLO11n at every
   precision, YOLOv8n FP32 and INT8, YOLO11s INT8: -35 to -58 %, points 3 and 4).
6. **Priors, measured or cited.** *5 us a layer*: on the lent H100, PyTorch's CUDA-graph replay of digits-cnn at batch
   1 takes 0.056 ms for its 11 ops (at least a kernel each; `docs/benchmarks/gpu_ort_h100.json`, torch-graph, FP32 and
   FP16), at most about 5 us a kernel doing almost no work: back-to-back kernels with no host in between, on a
   data-centre GPU. Jetson GPUs clock
   at 0.9-1.3 GHz, so 5 us is the low side; the published rows do not settle it (point 3). *Memory at 0.75 of the
   bandwidth*: still a prior, no Jetson bandwidth was measured here; without the pull every fold preferred 0.9-1.0.
   *Per-class efficiencies* (0.45-0.6): priors; without the pull every fold kept the INT8 scale at x1.00.
7. **DLA.** The ResNet-50 Offline rows ran on the GPU and both DLAs; the estimate adds the DLAs' dense INT8 figure at the
   GPU's efficiency (AGX Orin: 52.5 of the GPU's 85 TOPS, +62 %; Orin NX: 20 of 30, +67 %). NVIDIA's own AGX config
   expects 4,500/s of its 6,400/s from the GPU (+43 % from the DLAs). For RetinaNet the v3.0 configs expect 65/s
   from the AGX Orin's GPU and 94/s with both DLAs (+45 %), 20/s and 32/s on the Orin NX (+60 %): the estimate's
   +62 % / +67 % is high for the AGX Orin, part of the +39 % of its v3.0 Offline row.
8. **3D-UNet: costed, not scored.** `scripts/published_graphs.py` builds MLPerf's KiTS19 3D-UNet (Conv3d,
   InstanceNorm3d, ConvTranspose3d; 23 / 22 / 5 nodes as the published ONNX counts them; 957 GOPs a 128x128x128
   sub-volume), and the TensorRT layer model now runs each InstanceNorm as a layer of its own (its statistics span a
   channel's whole volume; NVIDIA's harness uses an INSTNORM3D plugin with the activation fused in). Estimated INT8,
   one sub-volume: 43.4 ms on the AGX Orin (MAXN), 117.1 ms on the Orin NX (25W). MLPerf v3.0's NVIDIA SingleStream
   latency is per CT volume (sliding window, overlap 0.5): 1.53 s median, 1.95 s mean on the AGX Orin, 4.04 / 5.18 s
   on the Orin NX ([AGX](https://github.com/mlcommons/inference_results_v3.0/blob/1948f9b5b93c5b4dcafe15de0faa08cdf1439fca/closed/NVIDIA/results/Orin_TRT/3d-unet-99/SingleStream/performance/run_1/mlperf_log_summary.txt),
   [NX](https://github.com/mlcommons/inference_results_v3.0/blob/1948f9b5b93c5b4dcafe15de0faa08cdf1439fca/closed/NVIDIA/results/Orin_NX_TRT/3d-unet-99/SingleStream/performance/run_1/mlperf_log_summary.txt)).
   Each volume is a different number of sub-volumes and no file read gives those counts, so no row is scored; what
   can be checked is the ratio between the modules, which the counts cancel: published NX / AGX 2.64x (median) and
   2.65x (mean), estimated 2.70x. (At the estimate, a mean volume would be about 45 sub-volumes on either module.)
9. **Not added**: MLPerf v4.0 and v4.1 (their closed Orin results hold only GPT-J and Stable Diffusion XL, no graph
   here for either), v5.x (its results repository was not readable here: too many files for a snapshot), and the v3.0
   MaxQ power runs (fixed clocks, e.g. `soc_gpu_freq` 522.75-918 MHz in the configs, that no power mode of the
   target profiles describes).
   **Not measured here**: every figure is copied from its source with its conditions; the x86 section at the top of
   this page is regenerated by `scripts/estimate_accuracy.py` on its own, the H100 / H200 sections are the runs they
   describe."""
