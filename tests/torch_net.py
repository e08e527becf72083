"""torch_net: Downpour's model spec as a PyTorch module, for the tests and
benchmarks that compare with PyTorch (tests/integration/torch_load.py,
tests/bench/torch_train.py, tests/gpu/torch_bench.py).

Parameter names follow common/model.c (conv1, conv2, fc1, ...; for the
resnetN presets torchvision's conv1, bn1, layer{1,2,3}.{i}.conv1/.bn1/
.conv2/.bn2, fc), so a Downpour checkpoint loads with
load_state_dict(strict=True); the module outputs logits (the spec's softmax
is the loss; a sigmoid's, 'fc:1 sigmoid', is BCEWithLogitsLoss on the one
logit)."""
import collections

import torch.nn.functional as F
from torch import nn

DEFAULT_SPEC = "conv5x5:32 relu maxpool2 conv5x5:64 relu maxpool2 fc:512 relu fc:10 softmax"


class BasicBlock(nn.Module):
    """He et al.'s CIFAR block as PyTorch users write it: two 3x3 convolutions
    without bias, each followed by batch norm; option-A shortcut (stride
    subsample, channels zero-padded evenly) where the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.stride, self.lo, self.hi = stride, (cout - cin) // 2, cout - cin - (cout - cin) // 2

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        sc = x
        if self.stride != 1 or self.lo or self.hi:
            sc = F.pad(x[:, :, ::self.stride, ::self.stride], (0, 0, 0, 0, self.lo, self.hi))
        return F.relu(out + sc)


class CifarResNet(nn.Module):
    """resnetN (N = 6n + 2): conv1, bn1, layer1..3 of n blocks (16, 32, 64
    channels), global average pooling, fc."""

    def __init__(self, depth, in_c, classes=10):
        super().__init__()
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_c, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        cin, stages = 16, []
        for s, c in enumerate((16, 32, 64)):
            blocks = []
            for i in range(n):
                blocks.append(BasicBlock(cin, c, 2 if s > 0 and i == 0 else 1))
                cin = c
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def build_module(spec, in_shape):
    """nn.Sequential with PyTorch names conv1, fc1, ... as model.h numbers them
    (a resnetN preset: CifarResNet)."""
    if spec.startswith("resnet"):
        return CifarResNet(int(spec[6:]), in_shape[0])
    c, h, w = in_shape
    layers = collections.OrderedDict()
    n_conv = n_fc = n_other = 0
    flat = False
    toks = spec.split()
    for i, tok in enumerate(toks):
        if tok.startswith("conv"):
            parts = tok[4:].split(":")
            k1, k2 = (int(x) for x in parts[0].split("x"))
            out = int(parts[1])
            pad = k1 // 2 if len(parts) < 3 or parts[2] == "same" else 0
            n_conv += 1
            layers[f"conv{n_conv}"] = nn.Conv2d(c, out, (k1, k2), padding=pad)
            c, h, w = out, h + 2 * pad - k1 + 1, w + 2 * pad - k2 + 1
        elif tok == "relu":
            n_other += 1
            layers[f"relu_{n_other}"] = nn.ReLU()
        elif tok.startswith("maxpool"):
            k = int(tok[7:])
            n_other += 1
            layers[f"pool_{n_other}"] = nn.MaxPool2d(k)
            h, w = h // k, w // k
        elif tok.startswith("fc:"):
            if not flat:
                layers["flatten"] = nn.Flatten()
                c, h, w, flat = c * h * w, 1, 1, True
            out = int(tok[3:])
            n_fc += 1
            layers[f"fc{n_fc}"] = nn.Linear(c, out)
            c = out
        elif tok == "tanh":
            n_other += 1
            layers[f"tanh_{n_other}"] = nn.Tanh()
        elif tok in ("softmax", "sigmoid"):
            # the loss, not a module: cross_entropy on the logits, or for
            # sigmoid BCEWithLogitsLoss on fc:1's one logit (nn.Linear(IN, 1))
            if i != len(toks) - 1:
                raise ValueError(f"spec: {tok} must be last: {spec}")
        else:
            raise ValueError(f"spec: unknown token {tok!r}")
    return nn.Sequential(layers)
