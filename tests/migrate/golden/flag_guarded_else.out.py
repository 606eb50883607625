"""A flag with an `else` that builds the fp32 path (pix2pix-style GAN): both optimizers come from amp
on one path and from the model on the other; each loss is scaled only under the flag."""
import torch
from options import opt

model = create_model(opt)
# apexlite migrate: amp.initialize (opt_level O1) ran only when `bool(opt.fp16)`: it became
#     torch.autocast(float16) around the forward pass and the loss and torch.amp.GradScaler
#     (scaler), on every path, enabled by that flag
amp_device_type = next(model.parameters()).device.type
scaler = torch.amp.GradScaler(amp_device_type, enabled=bool(opt.fp16))
if opt.fp16:
    model, [optimizer_G, optimizer_D] = model, [model.optimizer_G, model.optimizer_D]
    model = torch.nn.DataParallel(model, device_ids=opt.gpu_ids)
else:
    optimizer_G, optimizer_D = model.module.optimizer_G, model.module.optimizer_D

for epoch in range(opt.epochs):
    for data in dataset:
        with torch.autocast(device_type=amp_device_type, dtype=torch.float16, enabled=bool(opt.fp16)):
            losses, generated = model(data["label"], data["image"])
            loss_D = (losses[0] + losses[1]) * 0.5
            loss_G = losses[2]
        optimizer_G.zero_grad()
        if opt.fp16:
            scaler.scale(loss_G).backward()
        else:
            loss_G.backward()
        scaler.step(optimizer_G)
        optimizer_D.zero_grad()
        if opt.fp16:
            scaler.scale(loss_D).backward()
        else:
            loss_D.backward()
        scaler.step(optimizer_D)
        scaler.update()
