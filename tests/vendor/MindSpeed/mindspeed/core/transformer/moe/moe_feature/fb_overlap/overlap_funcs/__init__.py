#  Copyright (c) Huawei Technologies Co., Ltd. 2025-2025. All rights reserved.

from .fwd import *
from .bwd import *
from .fwdbwd import *