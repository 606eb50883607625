"""`apex_C` (apexlite.compat.apex_C): flatten/unflatten against torch.cat and the tensors' own values."""
import torch

from apexlite.compat import apex_C


def test_flatten_concatenates_and_unflatten_gives_views_shaped_like_the_originals():
    tensors = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 1, 3), torch.randn(0)]
    flat = apex_C.flatten(tensors)
    assert flat.dim() == 1 and torch.equal(flat, torch.cat([t.reshape(-1) for t in tensors]))
    pieces = apex_C.unflatten(flat, tensors)
    assert isinstance(pieces, list)
    for piece, original in zip(pieces, tensors):
        assert piece.shape == original.shape and torch.equal(piece, original)
        assert piece.numel() == 0 or piece.data_ptr() >= flat.data_ptr()  # views into flat, as apex's were
    pieces[0].fill_(0.0)
    assert not flat[:12].any()


def test_non_contiguous_tensors_flatten_in_their_logical_order():
    tensor = torch.arange(6.0).reshape(2, 3).t()
    assert torch.equal(apex_C.flatten([tensor]), torch.tensor([0.0, 3.0, 1.0, 4.0, 2.0, 5.0]))
