// Precompiled for every Ferry target: LibTorch's headers dominate compile time.
#pragma once
#include <torch/torch.h>
