import torch
from apexlite import amp

model = torch.nn.Linear(4, 4).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
# apexlite migrate: amp stays on apexlite: O2's fp32 master weights have no torch.amp recipe;
#     --o2=bf16-autocast moves it to native bf16 autocast instead
model, optimizer = amp.initialize(model, optimizer, opt_level="O2", keep_batchnorm_fp32=True, loss_scale="dynamic")
for _ in range(3):
    loss = model(torch.randn(2, 4).cuda()).float().sum()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
    optimizer.step()
