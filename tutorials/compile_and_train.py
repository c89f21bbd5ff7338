"""Tutorial: compile a torch model with rootclad, check it against torch, train it.

Run: python tutorials/compile_and_train.py
"""

import torch

import rootclad

torch.manual_seed(0)

# 1. An ordinary torch model and a batch of data (signal: the mean of a noisy trace).
net = torch.nn.Sequential(
    torch.nn.Conv1d(1, 8, 9, padding=4), torch.nn.GELU(), torch.nn.AvgPool1d(4),
    torch.nn.Flatten(), torch.nn.LazyLinear(16), torch.nn.Tanh(), torch.nn.Linear(16, 1),
)  # fmt: skip
x = torch.randn(64, 1, 256)
y = (x.mean(dim=(1, 2)) > 0).float()
net(x)  # materialise LazyLinear

# 2. Compile it. `engine="auto"` takes Clad when it is installed; cm.engine says which ran.
cm = rootclad.compile(net, example_input=x, loss="bce_with_logits")
print(cm)

# 3. Same loss and gradients as torch autograd (float32 rounding aside).
loss, grads = cm.loss_and_grad(x, y)
ref = torch.nn.functional.binary_cross_entropy_with_logits(net(x).squeeze(1), y)
ref_grads = torch.autograd.grad(ref, list(net.parameters()))
worst = max(float((grads[k] - g).abs().max()) for k, g in zip(grads, ref_grads, strict=True))
print(f"loss {loss.item():.6f} (torch {ref.item():.6f}); largest gradient difference {worst:.2e}")

# 4. The compiled model is a torch.autograd.Function: it composes with torch code.
x_req = x.clone().requires_grad_()
saliency = torch.autograd.grad(cm(x_req).sum(), x_req)[0]
print(f"input saliency shape {tuple(saliency.shape)}")

# 5. Train with the fused C++ step (forward + backward + Adam in one call).
opt = rootclad.optim.Adam(cm, lr=3e-3)
for step in range(200):
    loss = cm.train_step(x, y, opt)
    if step % 50 == 0:
        print(f"step {step:3d}: loss {loss:.4f}")
cm.eval()
acc = float(((cm.predict(x).squeeze(1) > 0).float() == y).float().mean())
print(f"final loss {loss:.4f}, training accuracy {acc:.2f}")

# 6. The trained weights go back into the torch module.
net.load_state_dict(cm.state_dict())
print("torch module now predicts", float(((net(x).squeeze(1) > 0).float() == y).float().mean()))
