import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp.initialize (opt_level O3) became the model cast to float16 (pure
#     low-precision training)
# apexlite migrate: O3 traps: no fp32 master weights (updates below float16's resolution are lost),
#     batchnorm and optimizer state in float16 (the model's inputs are cast in and its outputs back
#     to float32 by the hooks below, as apex did); torch.autocast (O1) is the safer recipe
model.half()
model.register_forward_pre_hook(
    lambda module, args, kwargs: torch.utils._pytree.tree_map(lambda a: a.half() if torch.is_tensor(a) and a.is_floating_point() else a, (args, kwargs)), with_kwargs=True)
model.register_forward_hook(
    lambda module, args, output: torch.utils._pytree.tree_map(lambda a: a.float() if torch.is_tensor(a) and a.is_floating_point() else a, output))
for _ in range(3):
    loss = model(torch.randn(2, 4)).float().sum()
    loss.backward()
    optimizer.step()
