"""Mixed precision behind a run-time switch (hparams.fp16_run), in the shape of NVIDIA's speech-model
training scripts: amp.initialize, the scaled backward, the master-params clipping and the checkpoint's amp
state each under the flag, a plain fp32 path in the `else` branches."""
import math

import torch


def train(hparams, loader, checkpoint=None):
    model = build_model(hparams).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=hparams.learning_rate)

    if hparams.fp16_run:
        from apex import amp
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
        if checkpoint is not None:
            amp.load_state_dict(checkpoint["amp"])

    is_overflow = False
    for iteration, batch in enumerate(loader):
        model.zero_grad()
        x, y = model.parse_batch(batch)
        y_pred = model(x)
        loss = criterion(y_pred, y)
        if hparams.fp16_run:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()

        if hparams.fp16_run:
            grad_norm = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), hparams.grad_clip_thresh)
            is_overflow = math.isnan(grad_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), hparams.grad_clip_thresh)

        optimizer.step()
        if not is_overflow:
            print(f"{iteration} loss {loss.item():.4f} scale {amp._amp_state.loss_scalers[0].loss_scale()}")
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    if hparams.fp16_run:
        state["amp"] = amp.state_dict()
    return state
