"""A flag with an `else` that builds the fp32 path (pix2pix-style GAN): both optimizers come from amp
on one path and from the model on the other; each loss is scaled only under the flag."""
import torch
from options import opt

model = create_model(opt)
if opt.fp16:
    from apex import amp
    model, [optimizer_G, optimizer_D] = amp.initialize(model, [model.optimizer_G, model.optimizer_D], opt_level='O1')
    model = torch.nn.DataParallel(model, device_ids=opt.gpu_ids)
else:
    optimizer_G, optimizer_D = model.module.optimizer_G, model.module.optimizer_D

for epoch in range(opt.epochs):
    for data in dataset:
        losses, generated = model(data["label"], data["image"])
        loss_D = (losses[0] + losses[1]) * 0.5
        loss_G = losses[2]
        optimizer_G.zero_grad()
        if opt.fp16:
            with amp.scale_loss(loss_G, optimizer_G) as scaled_loss: scaled_loss.backward()
        else:
            loss_G.backward()
        optimizer_G.step()
        optimizer_D.zero_grad()
        if opt.fp16:
            with amp.scale_loss(loss_D, optimizer_D) as scaled_loss: scaled_loss.backward()
        else:
            loss_D.backward()
        optimizer_D.step()
