"""A test that apex imported and an edit of apex's O1 op lists: each TODO says what to do instead."""
import torch
from apex import amp

# TODO(apexlite migrate): `amp` has no certain torch rewrite: it only tests whether apex imported,
#     and the migrated script does not import it: delete the test
assert amp is not None, "install apex"
# TODO(apexlite migrate): `amp.lists.functional_overrides.FP32_FUNCS.remove` has no certain torch
#     rewrite: it edits apex's O1 op lists, which torch.autocast does not read (it has its own, with
#     no override): where the script moved an op to another precision (softmax to float16, say),
#     cast that op's inputs where it is called, or leave the edit out and accept torch.autocast's
#     choice
amp.lists.functional_overrides.FP32_FUNCS.remove("softmax")
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
loss = model(torch.randn(2, 4)).sum()
with amp.scale_loss(loss, optimizer) as scaled:
    scaled.backward()
optimizer.step()
