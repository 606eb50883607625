"""O3 with keep_batchnorm_fp32=True (apex's suggested speed baseline): low-precision activations into fp32
batchnorm need amp's casts, which plain torch has no form of, so amp stays, imported from apexlite."""
import torch
from apexlite import amp

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# apexlite migrate: amp stays on apexlite: O3 with keep_batchnorm_fp32=True has no plain-torch form
#     (low-precision activations into fp32 batchnorm need amp's casts); to go native, train with O1
#     (torch.autocast) instead
model, optimizer = amp.initialize(model, optimizer, opt_level="O3", keep_batchnorm_fp32=True,
                                  cast_model_type=torch.bfloat16)
for step in range(4):
    x = torch.randn(8, 8)
    loss = model(x).float().pow(2).mean()
    with amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.step()
    optimizer.zero_grad()
