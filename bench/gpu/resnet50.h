#pragma once
// ResNet-50 (He et al., torchvision's v1.5: the stride in the bottleneck's 3x3 conv) for the GPU benchmark,
// the same layers and names as bench/gpu/resnet50.py, so both sides train the same network.
#include <ampp/train/models.h>

#include <memory>

namespace ampp::bench {

/// ImageNet's shapes: [N, 3, 224, 224] in, [N, classes] out. channels_last: the input, and so every
/// activation, in NHWC order (cuDNN's fast layout for fp16/bf16 convolutions).
std::shared_ptr<ampp::train::ClassifierImpl> make_resnet50(int64_t classes, bool channels_last);

}  // namespace ampp::bench
