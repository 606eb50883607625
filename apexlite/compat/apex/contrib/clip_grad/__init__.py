"""`apex.contrib.clip_grad`: clip_grad_norm_."""
from apexlite.compat.apex.contrib.clip_grad.clip_grad import clip_grad_norm_  # noqa: F401
