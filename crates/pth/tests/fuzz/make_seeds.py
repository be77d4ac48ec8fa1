"""The fuzz harness's seed corpus: real torch.save archives, written into argv[1].

torchvision state_dicts (built with weights=None: no network), tensors of every dtype the
reader converts, views sharing one storage, non-contiguous strides, a parameter, an
OrderedDict carrying `_metadata`, and one file the reader must refuse (a complex tensor).
"""
import collections
import os
import sys

import torch
import torchvision

out = sys.argv[1]
torch.manual_seed(0)


def save(name, obj):
    torch.save(obj, os.path.join(out, name))


save("squeezenet1_1.pth", torchvision.models.squeezenet1_1(weights=None, num_classes=10).state_dict())
save("mobilenet_v3_small.pth", torchvision.models.mobilenet_v3_small(weights=None, num_classes=10).state_dict())

dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
save("dtypes.pth", {str(d).removeprefix("torch."): (torch.arange(12) % 5).to(d).reshape(3, 4)
                    for d in dtypes})

base = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
views = collections.OrderedDict()
views["base"] = base
views["row"] = base[1]
views["transposed"] = base.transpose(0, 2)
views["strided"] = base[:, 1:4:2, ::3]
views["scalar"] = base[2, 3, 4]
views["empty"] = base[:, :0]
views["param"] = torch.nn.Parameter(torch.ones(2, 3))
views._metadata = collections.OrderedDict({"": {"version": 1}, "block": {"version": 2}})
save("views.pth", views)

save("complex.pth", {"z": torch.zeros(3, dtype=torch.complex64)})
