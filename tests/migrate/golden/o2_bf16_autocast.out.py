import torch

model = torch.nn.Linear(4, 4).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
# apexlite migrate: O2 (fp16 weights, fp32 master weights) became bf16 autocast over the fp32 model
#     (--o2=bf16-autocast); bf16 needs no loss scaling
# apexlite migrate: amp.initialize (opt_level O2) became torch.autocast(bfloat16) around the forward
#     pass and the loss
for _ in range(3):
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss = model(torch.randn(2, 4).cuda()).float().sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
