from salactl.runtime.ops.selection.reference import (
    block_scores, compress_keys, num_windows, select_blocks, sparse_token_mask, window_scores,
)

__all__ = ["block_scores", "compress_keys", "num_windows", "select_blocks", "sparse_token_mask",
           "window_scores"]
