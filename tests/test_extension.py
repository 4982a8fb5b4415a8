"""TorchRL's C++ extension holds the segment trees behind every prioritized sampler. It loads
only against the torch it was built for, so a drifted torch pin must fail here, loudly."""

import torch


def test_segment_tree_extension_loads_and_sums() -> None:
    from torchrl._torchrl import SumSegmentTreeFp32  # ImportError when the extension is broken

    tree = SumSegmentTreeFp32(8)
    tree[torch.arange(8)] = torch.arange(8, dtype=torch.float32)
    assert tree.query(0, 8) == 28.0
    # The prefix-sum search a prioritized sampler draws with: 10 falls in slot 4 (0+1+2+3=6, +4=10).
    assert tree.scan_lower_bound(torch.tensor([10.0])).tolist() == [4]
