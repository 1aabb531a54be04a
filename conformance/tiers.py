"""The smoke tier (``-m smoke``): the per-change CI stage (``docs/DESIGN.md#tiers``).

Every capability (configure, each op, each layer kind), mode (SP or not,
transposed weight, chunk counts, deterministic, w8A16, fused, auto,
``customized_coc``, saved gathers, uneven and exact data, kept results, TP
subgroups, stragglers, training steps, gradient-accumulation fusion, every
corner of the case space: odd widths, large gathers, TP 1, strided operands,
same-shape calls, op sequences, group size 128, autocast),
requirement level and error kind at least once, ops and layers at TP 2 and
TP 8, the whole corpus (``suite/test_corpus.py``) -- and, proven by
``tests/suite_runs/test_suite_bites.py``, every fault of the proof table.
Patterns match case ids (``test_layers.py::test_x[params]``); the
scheduling plugin marks the cases at collection.
"""

from __future__ import annotations

from conformance.caseids import matches

SMOKE: tuple[str, ...] = (
    # configuration: all of it (in-process, milliseconds), every rank at TP 2 and 8
    "test_config.py::*",
    # ops: each op on its float32 golden at TP 2 and TP 8, and with the weight stored [n, k]
    "test_ops.py::test_op_matches_golden[*-float32-*-tp2]",
    "test_ops.py::test_op_matches_golden[*-float32-*-tp8]",
    "test_ops.py::test_op_matches_golden[*-float32-*-tp2-wT]",
    # ... and the goldens inside the fused kernels' documented domain: each of torch_npu's MC2 kernels on an NPU node
    "test_ops.py::test_op_matches_golden[*-m64k512n64-float16-bias-tp2*]",
    "test_ops.py::test_op_matches_golden[*-m64k256n64-float16-bias-tp4*]",
    "test_ops.py::test_op_matches_golden[*-m64k2048n32-bfloat16-nobias-tp8*]",
    "test_ops.py::test_uneven_token_counts[*]",
    "test_ops.py::test_exact_layout[*-float32-tp2]",
    "test_ops.py::test_exact_layout[*-bfloat16-tp8]",
    "test_ops.py::test_results_are_values[*]",
    "test_ops.py::test_tp_subgroup_of_the_world[*-world4-tp2-contiguous]",
    "test_ops.py::test_tp_subgroup_of_the_world[*-world8-tp4-strided]",
    "test_ops.py::test_stragglers[*-rank1-*]",
    "test_ops.py::test_deterministic_is_bitwise_reproducible[*-float32-tp4]",
    "test_ops.py::test_w8a16_matches_dequantised_golden[*-per_groupg32-offset-float16-*-tp2]",
    "test_ops.py::test_w8a16_matches_dequantised_golden[*-per_channel-offset-bfloat16-*-tp8]",
    "test_ops.py::test_w8a16_bad_arguments_refused_on_every_rank[scale-shape-*]",
    "test_ops.py::test_w8a16_bad_arguments_refused_on_every_rank[group-not-multiple-of-32-*]",
    # ops in the corners of the case space: n % 8 != 0, 4096-row gathers, TP 1, strided operands, three calls
    # of one shape, two ops in a row, w8A16 group size 128
    "test_ops.py::test_corner_n_not_multiple_of_8[all_gather_matmul-*]",
    "test_ops.py::test_corner_large_gather[all_gather_matmul-*]",
    "test_ops.py::test_corner_tp1[matmul_all_reduce-*]",
    "test_ops.py::test_corner_strided_operands[matmul_all_reduce-*]",
    "test_ops.py::test_corner_same_shape_calls[matmul_all_reduce-*]",
    "test_ops.py::test_corner_op_sequence[all_gather_matmul-then-matmul_reduce_scatter-*]",
    "test_ops.py::test_corner_w8a16_group_size[*]",
    # layers: every kind and SP mode on float32 goldens at TP 2 and TP 8
    "test_layers.py::test_layer_matches_golden[*-float32-*-tp2-p2]",
    # the column part's output block has its weight's shape at TP 2 (a matmul known by its operands, not shape)
    "test_layers.py::test_layer_matches_golden[layer-mlp-sp-s64b1-h32x32-ffn64-*-tp2-p2]",
    "test_layers.py::test_layer_matches_golden[layer-row-nosp-*-float32-*-tp2-p4]",
    "test_layers.py::test_layer_matches_golden[*-float32-*-tp8-p4]",
    "test_layers.py::test_saved_all_gather_matches_golden[layer-column-*-float32-*-tp2]",
    "test_layers.py::test_layer_is_deterministic[layer-row-nosp-*-float32-*]",
    "test_layers.py::test_customized_coc_is_honoured[*-p2-custom4-tp2]",
    "test_layers.py::test_uneven_token_counts[*-tp2]",
    "test_layers.py::test_uneven_token_counts[mlp-sp-tp8]",
    "test_layers.py::test_fused_kernel_layers_match_golden[layer-mlp-sp-*-float32-*]",
    "test_layers.py::test_fused_kernel_layers_overlap[*]",
    "test_layers.py::test_auto_chunk_count_matches_golden[layer-row-nosp-*]",
    # training: steps, fusion and DP > 1 for every kind at TP 2, the MLP at TP 8, stragglers
    "test_training.py::test_training_steps[*-tp2]",
    "test_training.py::test_training_steps[mlp-sp-tp8]",
    "test_training.py::test_gradient_accumulation_fusion[*-tp2]",
    "test_training.py::test_gradient_accumulation_fusion[mlp-sp-tp8]",
    "test_training.py::test_layers_on_tp_subgroup[*-world4-tp2]",
    "test_training.py::test_layers_on_tp_subgroup[mlp-sp-world8-tp4]",
    "test_training.py::test_layer_stragglers[row-sp-tp4-rank1]",
    "test_training.py::test_layer_stragglers[mlp-nosp-tp4-random]",
    # layers in the corners: h_out % 8 != 0, TP 1, torch.autocast
    "test_training.py::test_corner_h_out_not_multiple_of_8[row-nosp-*]",
    "test_training.py::test_corner_tp1_layers[row-nosp-*]",
    "test_training.py::test_corner_autocast[row-sp-*]",
    # the corpus: the explorer's kept findings and every setting's boundaries (shipped and --coc-corpus), whole
    "test_corpus.py::*",
)


def in_smoke(case: str) -> bool:
    """Whether the case id belongs to the smoke tier."""
    return any(matches(case, pattern) for pattern in SMOKE)
