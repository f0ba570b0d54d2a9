"""ResNet-50 (torchvision's v1.5) for the GPU benchmark: the same layers and names as bench/gpu/resnet50.cpp,
written out here because the benchmark's machines need not have torchvision."""
import torch
from torch import nn


def _conv(cin, cout, kernel, stride):
    return nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False)


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1, self.bn1 = _conv(cin, width, 1, 1), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv(width, width, 3, stride), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = _conv(width, 4 * width, 1, 1), nn.BatchNorm2d(4 * width)
        self.downsample = None
        if stride != 1 or cin != 4 * width:
            self.downsample = nn.Sequential(_conv(cin, 4 * width, 1, stride), nn.BatchNorm2d(4 * width))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return torch.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet50(nn.Module):
    def __init__(self, classes=1000, channels_last=False):
        super().__init__()
        self.channels_last = channels_last
        self.conv1, self.bn1 = _conv(3, 64, 7, 2), nn.BatchNorm2d(64)
        cin = 64
        for stage, blocks in enumerate((3, 4, 6, 3)):
            width, layer = 64 << stage, []
            for b in range(blocks):
                layer.append(Bottleneck(cin, width, 2 if b == 0 and stage > 0 else 1))
                cin = 4 * width
            setattr(self, f"layer{stage + 1}", nn.Sequential(*layer))
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        for stage in range(1, 5):
            x = getattr(self, f"layer{stage}")(x)
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))
