"""`apex.amp.lists`: apex's O1 cast lists for torch, torch.Tensor and torch.nn.functional (see apexlite.compat.cast_lists)."""
