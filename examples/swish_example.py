"""A small model using a generated op, checked against plain autograd of the same formula."""

import torch

import generated

torch.manual_seed(0)
x = torch.randn(8, 16, dtype=torch.float64, requires_grad=True)

y = generated.swish(x, beta=1.5)
(grad,) = torch.autograd.grad(y.sum(), x, create_graph=True)
(second,) = torch.autograd.grad(grad.sum(), x)

plain = x * torch.sigmoid(1.5 * x)
(plain_grad,) = torch.autograd.grad(plain.sum(), x, create_graph=True)
(plain_second,) = torch.autograd.grad(plain_grad.sum(), x)

torch.testing.assert_close(y, plain)
torch.testing.assert_close(grad, plain_grad)
torch.testing.assert_close(second, plain_second)

layer = generated.ScaledWeight(16)
out = layer(x).pow(2).mean()
out.backward()
print(layer)
print(f"swish(x, beta=1.5): first and second derivatives match plain autograd; {layer.weights.grad.shape=}")
