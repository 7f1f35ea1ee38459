#!/usr/bin/env python3
"""Export a U-Net split into three TorchScript stages for Ferry.

    /usr/bin/python3 examples/export_torchscript_stages.py OUT_DIR

Writes encoder.pt (image -> its feature maps, a tuple or list), decoder.pt (the features as
separate arguments -> decoder output), head.pt (decoder output -> mask logits) and full.pt (the
whole model, for comparison; its parts are named encoder, decoder and segmentation_head). With
segmentation_models_pytorch installed the model is smp.Unet("resnet34", classes=1); without it, a
small U-Net of the same shape of parts, so the example runs on Debian's python3-torch alone.
Each part is traced in eval mode, as it is, without wrappers: Ferry passes the elements of a
stage's tuple or list output to the next stage as its arguments. Load them with
RemoteModule::from_torchscript.
"""
import os
import sys
import torch
from torch import nn


def conv_block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


class SmallEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleList([conv_block(3, 16), conv_block(16, 32), conv_block(32, 64)])

    def forward(self, x):
        features = [x]
        for i, stage in enumerate(self.stages):
            x = stage(x if i == 0 else nn.functional.max_pool2d(x, 2))
            features.append(x)
        return tuple(features)


class SmallDecoder(nn.Module):
    """Takes the features as separate arguments, as smp's decoder does."""

    def __init__(self):
        super().__init__()
        self.up1 = conv_block(64 + 32, 32)
        self.up2 = conv_block(32 + 16, 16)

    def forward(self, *features):
        x = features[3]
        x = self.up1(torch.cat([nn.functional.interpolate(x, scale_factor=2.0), features[2]], 1))
        return self.up2(torch.cat([nn.functional.interpolate(x, scale_factor=2.0), features[1]], 1))


class SmallUnet(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = SmallEncoder()
        self.decoder = SmallDecoder()
        self.segmentation_head = nn.Conv2d(16, 1, 3, padding=1)

    def forward(self, x):
        return self.segmentation_head(self.decoder(*self.encoder(x)))


def build():
    try:
        import segmentation_models_pytorch as smp
        model = smp.Unet("resnet34", encoder_weights=None, classes=1)
    except ImportError:
        model = SmallUnet()
    return model.encoder, model.decoder, model.segmentation_head, model


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "unet_stages"
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    encoder, decoder, head, full = build()
    for part in (encoder, decoder, head, full):
        part.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        features = tuple(encoder(x))
        decoded = decoder(*features)
        # strict=False: smp's encoder returns a list, which strict tracing refuses.
        torch.jit.trace(encoder, x, strict=False).save(os.path.join(out, "encoder.pt"))
        torch.jit.trace(decoder, features).save(os.path.join(out, "decoder.pt"))
        torch.jit.trace(head, decoded).save(os.path.join(out, "head.pt"))
        torch.jit.trace(full, x).save(os.path.join(out, "full.pt"))
    print(f"wrote encoder.pt, decoder.pt, head.pt and full.pt to {out}")


if __name__ == "__main__":
    main()
