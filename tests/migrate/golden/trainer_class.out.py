"""A training class (many research repositories' Trainer): amp.initialize on `self.model, self.optimizer` in
__init__ under the class's own flag, scale_loss, a clip of amp.master_params and the step in train_step, and
amp's state in the checkpoint methods. The GradScaler becomes an attribute beside them, read by every method."""
import torch


class Trainer:
    def __init__(self, fp16):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.fp16 = fp16
        # apexlite migrate: amp.initialize (opt_level O1) ran only when `bool(self.fp16)`: it became
        #     torch.autocast(float16) around the forward pass and the loss and torch.amp.GradScaler
        #     (self.scaler), on every path, enabled by that flag
        self.scaler = torch.amp.GradScaler("cpu", enabled=bool(self.fp16))

    def train_step(self, x):
        with torch.autocast(device_type="cpu", dtype=torch.float16, enabled=self.scaler.is_enabled()):
            loss = self.model(x).float().pow(2).mean()
        if self.fp16:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
            self.grad_norm = torch.nn.utils.clip_grad_norm_((p for group in self.optimizer.param_groups for p in group["params"]), 1.0)
        else:
            loss.backward()
            self.grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()
        return loss

    def checkpoint(self):
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.fp16:
            state["amp"] = self.scaler.state_dict()
        return state

    def resume(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.fp16:
            # apexlite migrate: checkpoints written before the migration hold apex's scaler state
            #     ({'loss_scaler0': {'loss_scale', 'unskipped'}}): such a state is read into GradScaler's form
            #     here (its scale and growth tracker), one written since is loaded as it is
            self.scaler.load_state_dict(state["amp"] if "scale" in state["amp"] else {**self.scaler.state_dict(), "scale": state["amp"]["loss_scaler0"]["loss_scale"], "_growth_tracker": state["amp"]["loss_scaler0"]["unskipped"]})


trainer = Trainer(fp16=True)
for step in range(4):
    loss = trainer.train_step(torch.randn(8, 8))
trainer.resume(trainer.checkpoint())
loss = trainer.train_step(torch.randn(8, 8))
