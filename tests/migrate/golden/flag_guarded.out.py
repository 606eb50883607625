"""Mixed precision behind a run-time switch (hparams.fp16_run), in the shape of NVIDIA's speech-model
training scripts: amp.initialize, the scaled backward, the master-params clipping and the checkpoint's amp
state each under the flag, a plain fp32 path in the `else` branches."""
import math

import torch


def train(hparams, loader, checkpoint=None):
    model = build_model(hparams).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=hparams.learning_rate)

    # apexlite migrate: amp.initialize (opt_level O1) ran only when `bool(hparams.fp16_run)`: it became
    #     torch.autocast(float16) around the forward pass and the loss and torch.amp.GradScaler
    #     (scaler), on every path, enabled by that flag
    scaler = torch.amp.GradScaler("cuda", enabled=bool(hparams.fp16_run))
    if hparams.fp16_run:
        if checkpoint is not None:
            # apexlite migrate: checkpoints written before the migration hold apex's scaler state
            #     ({'loss_scaler0': {'loss_scale', 'unskipped'}}): such a state is read into GradScaler's form
            #     here (its scale and growth tracker), one written since is loaded as it is
            scaler.load_state_dict(checkpoint["amp"] if "scale" in checkpoint["amp"] else {**scaler.state_dict(), "scale": checkpoint["amp"]["loss_scaler0"]["loss_scale"], "_growth_tracker": checkpoint["amp"]["loss_scaler0"]["unskipped"]})

    is_overflow = False
    for iteration, batch in enumerate(loader):
        model.zero_grad()
        with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=bool(hparams.fp16_run)):
            x, y = model.parse_batch(batch)
            y_pred = model(x)
            loss = criterion(y_pred, y)
        if hparams.fp16_run:
            scaler.scale(loss).backward()
        else:
            loss.backward()

        if hparams.fp16_run:
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), hparams.grad_clip_thresh)
            is_overflow = math.isnan(grad_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), hparams.grad_clip_thresh)

        scaler.step(optimizer)
        scaler.update()
        if not is_overflow:
            print(f"{iteration} loss {loss.item():.4f} scale {scaler.get_scale()}")
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    if hparams.fp16_run:
        state["amp"] = scaler.state_dict()
    return state
