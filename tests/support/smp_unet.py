"""segmentation_models_pytorch's Unet with a ResNet encoder, written out from its structure (smp is
no Debian package): the modules its state dict names and the forward it computes, on torchvision's
ResNet as smp's encoder is. Loads an export of Ferry strictly and checks that it gives the logits
Ferry computed for the same input.

usage: smp_unet.py WEIGHTS DEPTH CLASSES INPUT_AND_LOGITS
"""
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import resnet

LAYERS = {
    18: (resnet.BasicBlock, [2, 2, 2, 2]),
    34: (resnet.BasicBlock, [3, 4, 6, 3]),
    50: (resnet.Bottleneck, [3, 4, 6, 3]),
    101: (resnet.Bottleneck, [3, 4, 23, 3]),
    152: (resnet.Bottleneck, [3, 8, 36, 3]),
}


class ResNetEncoder(resnet.ResNet):
    """torchvision's ResNet less its classifier, giving the input and the five stages' outputs."""

    def __init__(self, block, layers):
        super().__init__(block, layers)
        del self.fc
        del self.avgpool

    def forward(self, x):
        stem = self.relu(self.bn1(self.conv1(x)))
        layer1 = self.layer1(self.maxpool(stem))
        layer2 = self.layer2(layer1)
        layer3 = self.layer3(layer2)
        return [x, stem, layer1, layer2, layer3, self.layer4(layer3)]


def conv_bn_relu(channels_in, channels_out):
    return nn.Sequential(
        nn.Conv2d(channels_in, channels_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(inplace=True),
    )


class DecoderBlock(nn.Module):
    def __init__(self, channels_in, skip, channels_out):
        super().__init__()
        self.conv1 = conv_bn_relu(channels_in + skip, channels_out)
        self.attention1 = nn.Identity()
        self.conv2 = conv_bn_relu(channels_out, channels_out)
        self.attention2 = nn.Identity()

    def forward(self, x, skip):
        x = F.interpolate(x, scale_factor=2, mode="nearest")
        if skip is not None:
            x = torch.cat([x, skip], dim=1)
        return self.attention2(self.conv2(self.conv1(self.attention1(x))))


class UnetDecoder(nn.Module):
    def __init__(self, encoder_channels, decoder_channels=(256, 128, 64, 32, 16)):
        super().__init__()
        deepest_first = list(encoder_channels[1:])[::-1]
        ins = [deepest_first[0]] + list(decoder_channels[:-1])
        skips = deepest_first[1:] + [0]
        self.center = nn.Identity()
        self.blocks = nn.ModuleList(
            DecoderBlock(i, s, o) for i, s, o in zip(ins, skips, decoder_channels)
        )

    def forward(self, *features):
        deepest_first = features[1:][::-1]
        x = self.center(deepest_first[0])
        skips = deepest_first[1:]
        for k, block in enumerate(self.blocks):
            x = block(x, skips[k] if k < len(skips) else None)
        return x


class Unet(nn.Module):
    def __init__(self, depth, classes):
        super().__init__()
        block, layers = LAYERS[depth]
        self.encoder = ResNetEncoder(block, layers)
        wide = block.expansion
        self.decoder = UnetDecoder((3, 64, 64 * wide, 128 * wide, 256 * wide, 512 * wide))
        # smp's head: the convolution, then its upsampling and activation, here none.
        self.segmentation_head = nn.Sequential(
            nn.Conv2d(16, classes, 3, padding=1), nn.Identity(), nn.Identity()
        )

    def forward(self, x):
        return self.segmentation_head(self.decoder(*self.encoder(x)))


def main(weights, depth, classes, input_and_logits):
    model = Unet(int(depth), int(classes))
    model.load_state_dict(torch.load(weights), strict=True)
    model.eval()
    io = torch.load(input_and_logits)
    with torch.no_grad():
        logits = model(io["input"])
    expected = io["logits"]
    assert logits.shape == expected.shape, (logits.shape, expected.shape)
    difference = (logits - expected).abs().max().item()
    scale = expected.abs().max().item()
    print(f"logits {tuple(logits.shape)}: largest difference {difference:.3g} of {scale:.3g}")
    assert difference <= 1e-5 * max(scale, 1.0), difference


if __name__ == "__main__":
    main(*sys.argv[1:])
